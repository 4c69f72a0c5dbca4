"""The package version (one place: nvfp4lab.__version__ and the checkpoints' metadata read it)."""
__version__ = "0.1.0"
