"""Whether an open websocket may still receive: its session, user and role re-checked.

A socket is authorised when it connects, but the session can end (logout), the user can be
deactivated or lose the role afterwards. Each of those announces itself to the user's
Channels group (`access_group`), whose sockets then re-check at once; and every socket
re-checks before a push at least every ``settings.WEBSOCKET_RECHECK_S`` (30 s), which also
covers changes that send no signal (a bulk update, an expired session).
"""

from __future__ import annotations

import logging
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_save

from controlplane.services.accounts import end_session
from controlplane.services.roles import has_role

log = logging.getLogger(__name__)
CHECK_MESSAGE = {"type": "access.check"}  # handled by `access_check` of every consumer


def access_group(user_pk: Any) -> str:
    return f"access.{user_pk}"


@database_sync_to_async
def session_allows(session_key: str | None, user_pk: Any, minimum: str) -> bool:
    """Whether the session still belongs to this user (not logged out, password unchanged),
    and the user is active with at least the ``minimum`` role, read now."""
    if not session_key or user_pk is None:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    # verifies the session's auth hash; reads only the session (django-stubs asks for a request)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    return user.pk == user_pk and has_role(user, minimum)


def announce(user_pk: Any) -> None:
    """Ask the user's open sockets to re-check, once the current transaction commits."""
    transaction.on_commit(lambda: _send_check(user_pk))


def _send_check(user_pk: Any) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    try:
        async_to_sync(get_channel_layer().group_send)(access_group(user_pk), CHECK_MESSAGE)
    except Exception as error:  # never fail a logout; the periodic re-check still runs
        log.warning("could not ask user %s's sockets to re-check: %s", user_pk, error)


def _on_logout(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    # Django flushes the session only after this signal: ended first, or a socket that
    # re-checks at once still finds it valid and stays open until its next push
    end_session(getattr(request, "session", None))
    if user is not None:
        announce(user.pk)


def _on_user_saved(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    if update_fields is not None and set(update_fields) <= {"last_login"}:
        return  # every login saves this; it grants nothing
    announce(instance.pk)


def _on_groups_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    if not reverse:  # a user's groups changed
        if action in ("post_add", "post_remove", "post_clear"):
            announce(instance.pk)
    elif action == "pre_clear":  # a group emptied: its members are known only before
        for user_pk in instance.user_set.values_list("pk", flat=True):
            announce(user_pk)
    elif action in ("post_add", "post_remove"):  # a group's members changed
        for user_pk in pk_set or ():
            announce(user_pk)


def connect_signals() -> None:
    """Announce logouts, user changes (active, superuser) and group (role) changes."""
    user_model = get_user_model()
    user_logged_out.connect(_on_logout, dispatch_uid="switchyard-access-logout")
    post_save.connect(_on_user_saved, sender=user_model, dispatch_uid="switchyard-access-user")
    m2m_changed.connect(
        _on_groups_changed,
        sender=user_model.groups.through,
        dispatch_uid="switchyard-access-groups",
    )
