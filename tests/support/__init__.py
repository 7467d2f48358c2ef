"""What the tests share: where the repository is (``paths``), rendering its manifests
(``kube``), and building objects and AdmissionReviews and reading decisions (``admission``).
Test modules import these by name; fixtures live in ``tests/conftest.py``."""
