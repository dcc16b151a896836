"""``python -m examples.indexer``: the reference outbox consumer (``examples.indexer.indexer``).

Its imports take most of a second; a Ctrl-C meanwhile is a clean stop before anything was followed
(exit 0, as later), so the handler is installed here, before them. This file is compiled on every
run (a ``__main__`` is never cached): it stays this small.
"""

import os
import signal

signal.signal(signal.SIGINT, lambda signum, frame: os._exit(0))

from examples.indexer.indexer import main  # noqa: E402

main()
