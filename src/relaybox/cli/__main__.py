"""``python -m relaybox.cli``: the ``relaybox`` command."""

from relaybox.cli import main

main()
