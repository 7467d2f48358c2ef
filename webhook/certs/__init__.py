"""The certificates layer: a private CA and the webhook's serving certificate (``pki``), put into
a cluster through the API (``install``) or into manifests for GitOps (``gitops``)."""
