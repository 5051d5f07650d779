"""``relaybox endpoints headers`` and ``relaybox endpoints credentials``: an endpoint's
custom request headers and its HTTP credentials (Basic, bearer token, OAuth2 client
credentials), as the tenant API's ``headers`` and ``credentials`` fields set them.

A secret given as ``-`` is read from standard input (one line), so that it stays out
of the shell's history. Credentials are sealed and never printed: the answer says
which kind is set.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from relaybox.cli.common import Target, app_options
from relaybox.cli.grammar import GrammarOption
from relaybox.cli.outbound import _echo, _endpoint, _model, _run, endpoints_group
from relaybox.outbound import endpoints
from relaybox.outbound.endpoints import EndpointPatch

__all__ = ["COMMANDS"]

COMMANDS: list[click.Command] = []  # subcommands of ``endpoints``, added below

_json_default = click.option("--json", "as_json", is_flag=True, help="JSON output (the default)")
"""``--json``: accepted for symmetry, these commands print JSON either way."""


def _secret(value: str | None, name: str) -> str:
    if value is None:
        raise click.UsageError(f"{name} is required")
    if value == "-":
        return sys.stdin.readline().rstrip("\r\n")
    return value


def _update(box: Any, endpoint_id: str, patch: EndpointPatch) -> dict[str, Any]:
    async def update() -> Any:
        found = await _endpoint(box, endpoint_id)
        return await endpoints.update_endpoint(box, endpoint_id, found.tenant, patch)

    updated = _run(box, update)
    return {**updated.to_json(), "tenant": updated.tenant}


@endpoints_group.command("headers")
@app_options
@click.argument("endpoint_id")
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE", help="a header (repeat)")
@click.option("--clear", is_flag=True, help="remove every custom header")
@_json_default
def endpoints_headers(
    target: Target,
    endpoint_id: str,
    pairs: tuple[str, ...],
    clear: bool,
    as_json: bool,
) -> None:
    """Replace an endpoint's custom request headers (--set X-Team=blue ...)."""
    if not pairs and not clear:
        raise click.UsageError("give --set NAME=VALUE (repeat it) or --clear")
    headers: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.UsageError(f"--set {pair!r}: expected NAME=VALUE")
        headers[name.strip()] = value
    box = target.load()
    _echo(_update(box, endpoint_id, _model(EndpointPatch, headers=headers)))


@endpoints_group.command("credentials")
@app_options
@click.argument("endpoint_id")
@click.option(
    "--kind",
    cls=GrammarOption,
    deprecated_names=("--type",),
    type=click.Choice(["basic", "bearer", "oauth2", "none"]),
    required=True,
    help="which credentials (none removes them)",
)
@click.option("--username", help="basic")
@click.option("--password", help="basic ('-': read from stdin)")
@click.option("--token", help="bearer ('-': read from stdin)")
@click.option("--token-url", help="oauth2: the token endpoint")
@click.option("--client-id", help="oauth2")
@click.option("--client-secret", help="oauth2 ('-': read from stdin)")
@click.option("--scope", default=None, help="oauth2 (optional)")
@_json_default
def endpoints_credentials(
    target: Target,
    endpoint_id: str,
    kind: str,
    username: str | None,
    password: str | None,
    token: str | None,
    token_url: str | None,
    client_id: str | None,
    client_secret: str | None,
    scope: str | None,
    as_json: bool,
) -> None:
    """Set (or remove) an endpoint's HTTP credentials; they are sealed, never shown."""
    spec: dict[str, Any] = {"type": kind}
    if kind == "basic":
        spec.update(username=username or "", password=_secret(password, "--password"))
    elif kind == "bearer":
        spec.update(token=_secret(token, "--token"))
    elif kind == "oauth2":
        spec.update(
            token_url=token_url or "",
            client_id=client_id or "",
            client_secret=_secret(client_secret, "--client-secret"),
            scope=scope,
        )
    box = target.load()
    _echo(_update(box, endpoint_id, _model(EndpointPatch, credentials=spec)))
