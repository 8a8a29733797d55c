"""The live dashboard in a real browser: headless Debian chromium (driven by selenium through
Debian's chromedriver: nothing is downloaded) against a running `echo2 run`. It logs in with
the operator token, sees the learner step advance and the worker table fill, and saves a
screenshot to the run dir (`dashboard.png`; docs/images/dashboard.png, in docs/observability.md, is one)."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import coordinator_url, processes, wait_for, write_config

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# CI sets ECHO2_REQUIRE_BROWSER=1 (.ci/run installs both): there a missing browser fails the test
pytestmark = [
    pytest.mark.integration,
    pytest.mark.system,
    pytest.mark.browser,
    pytest.mark.skipif((CHROMIUM is None or CHROMEDRIVER is None) and not os.environ.get("ECHO2_REQUIRE_BROWSER"),
                       reason="needs Debian's chromium and chromedriver: apt-get install -y chromium chromium-driver"),
]
PAGE_TIMEOUT_S = 30  # one page load or wait in the browser; the page polls every 2 s


def _browser():
    assert CHROMIUM and CHROMEDRIVER, "chromium or chromedriver missing: apt-get install -y chromium chromium-driver"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # with both binaries given, Selenium Manager downloads nothing
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1100", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    return driver


def _text(driver, css: str) -> str:
    return driver.find_element("css selector", css).text


def _step(driver) -> int:
    text = _text(driver, "#step")
    return int(text) if text.isdigit() else -1


def test_dashboard_shows_the_run_advancing(tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    # more steps than the test watches (20 a second here): the run is stopped, by PID, at the end
    cfg = small_run_config(tmp_path / "run", train={"steps": 5000, "eval_every": 5, "checkpoint_every": 1000},
                           learner={"price_per_hour": 2.5}, activation={"enabled": True},
                           workers={"count": 2, "per_worker": [{"price_per_hour": 0.34}, {"price_per_hour": 0.79}]})
    config = write_config(tmp_path / "run.toml", cfg)
    with processes() as start:
        # no operator token given: `echo2 run` keeps one in the run dir and says where
        run = start(["run", "--config", str(config)], tmp_path / "run.log", without=("ECHO2_OPERATOR_TOKEN",))
        url = wait_for(lambda: coordinator_url(cfg.run_path), 120, "the coordinator to listen", alive=run)
        key = cfg.run_path / "keys" / "operator.token"
        assert key.stat().st_mode & 0o777 == 0o600
        wait_for(lambda: f"dashboard: {url}/ (log in with the operator token in {key})" in
                 (tmp_path / "run.log").read_text(), 30, "the launcher to print the dashboard's address")
        driver = _browser()
        try:
            driver.get(url + "/")
            driver.find_element("id", "token").send_keys(key.read_text().strip())  # the login form
            driver.find_element("css selector", "#login button").click()
            wait = WebDriverWait(driver, 120, poll_frequency=0.5)
            first = wait.until(lambda d: _step(d) >= 1 and _step(d))
            later = wait.until(lambda d: _step(d) >= first + 3 and _step(d))
            assert later > first
            rows = wait.until(lambda d: len(d.find_elements("css selector", "#workers tbody tr")) >= 2
                              and d.find_elements("css selector", "#workers tbody tr"))
            ids = sorted(r.find_element("css selector", "td").text for r in rows)
            assert ids == ["w0", "w1"]
            # the curves and the tree drew (SVG made by the page's own script)
            wait.until(lambda d: d.find_elements("css selector", "#chart-reward polyline")
                       and d.find_elements("css selector", "#chart-accuracy polyline")
                       and len(d.find_elements("css selector", "#tree circle")) == 3)
            assert _text(driver, "#fleet").endswith("/ 2") and "$" in _text(driver, "#cost")
            assert "error" not in driver.find_element("id", "status").get_attribute("class")
            time.sleep(2.5)  # one more poll, so the screenshot shows settled charts
            driver.save_screenshot(str(cfg.run_path / "dashboard.png"))
        finally:
            driver.quit()
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
    assert (cfg.run_path / "dashboard.png").stat().st_size > 10_000
