"""A page of the control plane opened in Debian's chromium through Playwright."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_login_page_renders_in_chromium(browser, live_server, artifacts_dir) -> None:
    page = browser.new_page()
    try:
        page.goto(f"{live_server.url}/admin/login/")
        assert page.locator("input[name=username]").is_visible()
        assert "Log in" in page.title()
        page.screenshot(path=str(artifacts_dir / "admin-login.png"))
    finally:
        page.close()
