"""``relaybox portal link``: a signed link to one tenant's portal, as
``box.portal_link`` and the tenant API's ``POST /portal/sessions`` make it
(:mod:`relaybox.outbound.portal_links`). Signing needs the portal's key
(``portal.signing_key``, else derived from the endpoint secrets key or its key file),
not the database."""

from __future__ import annotations

import json

import click

from relaybox.cli.common import Target, app_options, json_option
from relaybox.cli.grammar import CliError
from relaybox.cli.table import format_time
from relaybox.errors import ConfigurationError
from relaybox.outbound.vault import SecretsLocked
from relaybox.timespec import parse_duration

__all__ = ["COMMANDS"]


@click.group("portal")
def portal_group() -> None:
    """The tenant portal: links that open it."""


@portal_group.command("link")
@app_options
@click.argument("tenant")
@click.option(
    "--ttl",
    default=None,
    help="how long the link opens a session: 10m, 1h or seconds (default: portal.link_ttl,"
    " at most portal.max_link_ttl)",
)
@click.option(
    "--base-url",
    default=None,
    help="where browsers reach relaybox (default: portal.public_url, else a path)",
)
@click.option(
    "--single-use/--reusable",
    default=None,
    help="it opens one session only, or several (default: portal.single_use_links)",
)
@json_option
def portal_link(
    target: Target,
    tenant: str,
    ttl: str | None,
    base_url: str | None,
    single_use: bool | None,
    as_json: bool,
) -> None:
    """Print a signed link that opens TENANT's portal (hand it to that tenant)."""
    box = target.load()
    life = None if ttl is None else parse_duration(ttl)
    try:
        link = box.portal_link(tenant, ttl=life, base_url=base_url, single_use=single_use)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except (ConfigurationError, SecretsLocked) as exc:
        raise CliError(str(exc), code="secrets_unavailable", exit_code=2) from None
    if as_json:
        click.echo(json.dumps({**link.to_json(), "tenant": link.tenant}))
    else:
        click.echo(link.url)
        click.echo(
            f"opens {tenant}'s portal until {format_time(link.expires_at)}"
            + (", once" if link.single_use else ""),
            err=True,
        )


COMMANDS = [portal_group]
