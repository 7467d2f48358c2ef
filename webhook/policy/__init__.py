"""The policy layer, lowest of all: the compiled policy model, loading (YAML with line numbers and
the JSON Schema), lint (errors and warnings), compilation, and the data the policy draws on (the
MIG catalogue, resource quantities, the packaged default policy and schemas). It imports nothing
else of ``webhook``."""
