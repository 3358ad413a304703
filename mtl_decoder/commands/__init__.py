"""The subcommands of ``mtl-decoder``, a module per group.

Each adds its commands' parsers (``add_*``) and the plain
functions they run (``run_*``), thin adapters over one library function. ``mtl_decoder.cli`` puts them together."""
