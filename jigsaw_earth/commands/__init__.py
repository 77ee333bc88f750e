"""Subcommands of the ``jigsaw-earth`` CLI; each module has ``add_parser`` and ``run``."""
