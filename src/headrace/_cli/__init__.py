"""The ``headrace`` command line."""
