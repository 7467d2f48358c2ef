"""The command line, on top of every other layer: ``main`` builds the parser (the only module
that imports the commands), one module per command, ``common`` for what they share, and the
output formats. Only this package turns typed errors into messages and exit codes."""
