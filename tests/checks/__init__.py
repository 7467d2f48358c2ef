"""Policy suites for the admission checks: one module per rule."""
