"""The admission layer: the decision. An AdmissionReview and a compiled policy in, a response
out: request parsing, the engine that runs the checks, the mutation plan and its JSON Patch, and
the response. Pure: no Flask, no I/O, no globals."""
