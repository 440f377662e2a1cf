"""Create an API token for a user and print it once (only its hash is stored)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.services.audit import Actor
from controlplane.services.errors import ServiceError
from controlplane.services.roles import role_of
from controlplane.services.tokens import DEFAULT_VALID_DAYS, create_api_token, user_named


class Command(BaseCommand):
    help = "Create an API token for USER named NAME and print it (it cannot be shown again)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("user", help="username the token acts as")
        parser.add_argument("name", help="what the token is for, e.g. 'ci-deploy'")
        parser.add_argument(
            "--days",
            type=int,
            default=DEFAULT_VALID_DAYS,
            help=f"days until it expires (default {DEFAULT_VALID_DAYS})",
        )

    def handle(self, *args, user: str, name: str, days: int, **options) -> None:
        try:
            owner = user_named(user)
            plaintext, _ = create_api_token(Actor.system("create_api_token"), owner, name, days)
        except ServiceError as error:
            raise CommandError(error.message) from None
        if role_of(owner) is None:
            self.stderr.write(
                f"warning: {user} has no role group (viewer, operator, admin); "
                "the token will be refused with 403 until it has one"
            )
        self.stdout.write(plaintext)
