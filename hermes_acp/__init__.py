"""hermes-acp: an Agent Client Protocol agent for code editors, built on Twisted."""

__version__ = "0.1.0"
__all__ = ["__version__"]
