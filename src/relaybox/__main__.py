"""``python -m relaybox`` runs the ``relaybox`` command."""

from relaybox.cli import main

main()
