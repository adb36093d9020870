"""archsearch: multi-objective search over hybrid sequence-model architectures."""

__version__ = "0.1.0"
