"""The serving layer: the Flask app around the pure decision, gunicorn wiring, TLS with
certificate reloading, the drain on SIGTERM, the policy store, metrics and logs."""
