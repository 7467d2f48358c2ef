"""``python -m webhook.cli``: the same as the ``gpu-admission`` command."""

import sys

from webhook.cli.main import main

sys.exit(main())
