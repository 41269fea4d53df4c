"""Loading, adapting (LoRA), precision and exporting models."""
