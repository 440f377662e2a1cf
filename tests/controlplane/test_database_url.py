"""SWITCHYARD_DATABASE_URL → Django's DATABASES entry (controlplane/settings.py)."""

import traceback

import pytest

from controlplane.settings import database_from_url


def test_percent_encoded_password_reaches_postgres_decoded() -> None:
    config = database_from_url("postgres://sw:p%40ss%2Fw%3Ard@db.example:6543/fleet")
    assert config["PASSWORD"] == "p@ss/w:rd"
    assert (config["USER"], config["HOST"], config["PORT"], config["NAME"]) == (
        "sw",
        "db.example",
        "6543",
        "fleet",
    )
    assert config["TEST"] == {"NAME": "test_fleet"}
    assert config["ENGINE"] == "django.db.backends.postgresql"


def test_unset_parts_take_the_local_defaults() -> None:
    config = database_from_url("postgresql://127.0.0.1")
    assert (config["USER"], config["PASSWORD"], config["PORT"], config["NAME"]) == (
        "postgres",
        "",
        "5432",
        "switchyard",
    )
    assert config["CONN_MAX_AGE"] == 60 and config["CONN_HEALTH_CHECKS"] is True
    assert config["OPTIONS"]["connect_timeout"] == 3


def test_a_url_of_another_database_is_refused_with_the_variable_named() -> None:
    with pytest.raises(ValueError, match="SWITCHYARD_DATABASE_URL must be a postgres://"):
        database_from_url("mysql://root@127.0.0.1/switchyard")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (  # another database
            "mysql://root:hunter2-Tr0ub4dor@127.0.0.1/switchyard",
            "mysql://root:***@127.0.0.1/switchyard",
        ),
        (  # a '/' in the password not percent-encoded: the parser reads a port from it
            "postgres://sw:hunter2/Tr0ub4dor@db.example:5432/fleet",
            "postgres://sw:***@db.example:5432/fleet",
        ),
        (  # a port that is no number
            "postgres://sw:hunter2-Tr0ub4dor@db.example:port/fleet",
            "postgres://sw:***@db.example:port/fleet",
        ),
    ],
)
def test_a_bad_url_is_refused_without_its_password(url: str, shown: str) -> None:
    with pytest.raises(ValueError, match="SWITCHYARD_DATABASE_URL") as refused:
        database_from_url(url)
    assert repr(shown) in str(refused.value)
    # the whole traceback, chained errors included, as a log would record it
    logged = "".join(traceback.format_exception(refused.value))
    assert "hunter2" not in logged and "Tr0ub4dor" not in logged
