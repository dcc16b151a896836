"""``python -m mcpsync.worker.cli``: the command line as the console script runs it (tests and benchmarks
start it so from a checkout)."""

from mcpsync.worker.cli.start import main

main()
