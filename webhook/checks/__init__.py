"""The checks, one module each, registered in ``webhook.checks.registry``."""
