"""semrl: reinforcement learning with verifiable rewards, built around semantic-entropy-guided
exploration (ROSE, SENT) and their baselines."""

from semrl.config import Config, ConfigError, load_config

__version__ = "0.1.0"

__all__ = ["Config", "ConfigError", "__version__", "load_config"]
