"""The MLflow UI after a real (small) sweep, in a real browser: `orchestrator ui` on a free
port, Debian's headless Chromium driven through Selenium and Debian's chromedriver (nothing is
downloaded). The experiment link of `tracking.ui_link` must open the training-runs view with
the four trials under their sweep, a trial's page must draw its `train/loss` curve, and the
link `orchestrator ui` prints for the sweep (the one the sweep's report printed, on the UI's own
port, never the default 5000) must open the runs' chart view with every trial's train/loss
against tokens on one chart, smoothed, each trial in its batch size's colour, and beside it the
run list by batch size: each trial's name beside a chip of its colour, the key.

Screenshots go into each test's tmp_path (experiment.png, train_loss.png, compare.png);
`UI_SCREENSHOTS=1` also writes docs/images/mlflow_compare.png.
"""

import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.tracking import mlflow_ui, run_tags
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, free_ports
from tests.integration.test_mlflow_server import Service

pytestmark = pytest.mark.slow
SMOKE = ROOT / "conf" / "sweep" / "smoke.yaml"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
TRIALS = {"B=2Ki lr=1e-3", "B=2Ki lr=3e-3", "B=4Ki lr=1e-3", "B=4Ki lr=3e-3"}  # + the warmup share
WAIT_S = 120  # the page's first load compiles a large bundle: slow on a busy 2-core machine


@pytest.fixture(scope="module")
def sweep(ray_session, tmp_path_factory):
    """The smoke sweep (4 trials, 2 batch sizes x 2 learning rates) with a third of its token
    budget: the UI needs finished runs with curves, not converged ones. The command runs in this
    process, on the tests' Ray."""
    from orchestrator import cli

    folder = tmp_path_factory.mktemp("ui-sweep")
    uri = f"sqlite:///{folder}/mlflow.db"
    here, printed = os.getcwd(), io.StringIO()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(printed):
            code = cli.main(["sweep", str(SMOKE), f"tracking.uri={uri}", "train.total_tokens=16384"])
    finally:
        os.chdir(here)
    out = printed.getvalue()
    assert code == 0, out[-3000:]
    (folder / "sweep.out").write_text(out)
    parent = Store(uri, "orchestrator").find_sweep_run("smoke")
    return uri, folder, parent, {r.name: r for r in Store(uri).child_runs(parent)}


@pytest.fixture(scope="module")
def ui(sweep):
    uri, folder, _, _ = sweep
    (port,) = free_ports(1)
    assert port != mlflow_ui.DEFAULT_PORT  # the links must follow the UI's port, not assume 5000
    service = Service(
        [sys.executable, "-m", "orchestrator", "ui", f"tracking.uri={uri}", "--port", str(port)],
        folder / "ui.log",
        health=f"http://127.0.0.1:{port}/health",
    )
    service.start()
    yield port
    service.stop()
    assert "MLflow UI on http://127.0.0.1" in (folder / "ui.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def browser():
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        if os.geteuid() != 0:
            pytest.skip(f"{', '.join(missing)} missing (Debian packages chromium, chromium-driver)")
        pytest.fail(f"{', '.join(missing)} missing although running as root: run `bash tests/setup_services.sh`")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    profile = tempfile.mkdtemp(prefix="orch-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1600,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # Selenium Manager must never fetch a browser or driver
        driver = webdriver.Chrome(service=DriverService(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver, condition, what, timeout=WAIT_S):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    try:  # an element found while the page re-renders goes stale: look again
        return WebDriverWait(
            driver, timeout, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)
        ).until(lambda d: condition())
    except Exception as exc:
        raise AssertionError(f"timed out waiting for {what} at {driver.current_url}") from exc


def text_of(driver):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def test_experiment_link_lists_the_four_trials(sweep, ui, browser, tmp_path):
    from selenium.webdriver.common.by import By

    uri, _, parent, trials = sweep
    assert {name.rsplit(" wu=", 1)[0] for name in trials} == TRIALS
    link = mlflow_ui.ui_link(uri, "orchestrator", ui)
    assert link.endswith("?workflowType=machine_learning")
    browser.get(link)
    wait(browser, lambda: "sweep smoke" in text_of(browser), "the sweep's parent run in the runs table")
    # Trials are nested under their sweep's run: expand it.
    row = browser.find_element(By.XPATH, "//*[@role='row'][.//*[normalize-space(text())='sweep smoke']]")
    assert row.get_attribute("row-id") == parent
    row.find_element(By.TAG_NAME, "button").click()
    wait(browser, lambda: all(name in text_of(browser) for name in trials), "the four trials under the sweep")
    browser.save_screenshot(str(tmp_path / "experiment.png"))
    for name, run in trials.items():
        cell = browser.find_element(By.XPATH, f"//*[@role='row' and @row-id='{run.run_id}']")
        assert cell.is_displayed() and name in cell.text, (name, cell.text)


def test_a_trial_page_draws_its_train_loss_curve(sweep, ui, browser, tmp_path):
    from selenium.webdriver.common.by import By

    uri, _, _, trials = sweep
    name = next(n for n in trials if n.startswith("B=2Ki lr=3e-3"))
    run_id = trials[name].run_id
    history = Store(uri).metric_history(run_id, "train/loss")
    assert len(history) >= 2
    browser.get(mlflow_ui.ui_link(uri, "orchestrator", ui, run_id=run_id))
    tab = wait(
        browser,
        lambda: browser.find_elements(By.XPATH, "//*[@role='tab' and normalize-space()='Model metrics']"),
        "the run page's tabs",
    )[0]
    assert name in text_of(browser)
    tab.click()
    search = wait(
        browser,
        lambda: browser.find_elements(By.XPATH, "//input[@placeholder='Search metric charts']"),
        "the metric charts",
    )[0]
    search.send_keys("train/loss")
    # The chart's title renders before its plot does (charts load lazily): wait for the card.
    card = wait(
        browser,
        lambda: browser.find_elements(
            By.XPATH, "//h4[@title='train/loss']/ancestor::*[.//*[contains(@class, 'js-plotly-plot')]][1]"
        ),
        "the train/loss chart",
    )[0]

    def drawn():  # the SVG has a size and one marker per logged point on a non-empty line
        svg = card.find_elements(By.CSS_SELECTOR, "svg.main-svg")
        lines = [p.get_attribute("d") or "" for p in card.find_elements(By.CSS_SELECTOR, "path.js-line")]
        points = card.find_elements(By.CSS_SELECTOR, "path.point")
        return (
            svg
            and svg[0].size["width"] > 100
            and svg[0].size["height"] > 100
            and any(len(d) > 20 for d in lines)
            and len(points) == len(history)
        )

    wait(browser, drawn, "the train/loss curve to be drawn", timeout=60)
    assert f"{name} (train/loss)" in card.text  # the legend names the trial
    browser.save_screenshot(str(tmp_path / "train_loss.png"))


def printed_link(lines, follows):
    """The compare link in `lines`: the one on the line that starts with `follows`, or after it."""
    at = next(i for i, line in enumerate(lines) if line.startswith(follows))
    link = (lines[at].split(": ", 1)[1] if "/#/" in lines[at] else lines[at + 1]).strip()
    assert "/#/experiments/" in link and "viewStateShareKey=" in link, link
    return link


def rgb(colour: str):
    """(red, green, blue) of '#rrggbb' (a run's mlflow.runColor) or of the browser's 'rgb(r, g, b)'
    or 'rgba(r, g, b, a)'."""
    if colour.startswith("#"):
        return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return tuple(int(float(c)) for c in colour[colour.index("(") + 1 : colour.index(")")].split(",")[:3])


def test_the_link_ui_prints_draws_every_trial_in_its_batch_sizes_colour_with_a_key(sweep, ui, browser, tmp_path):
    """The link `orchestrator ui` prints (the report's, at the UI's own port) opens the runs' chart
    view on the sweep's view state: one chart draws every trial's train/loss against Step (tokens
    seen), a smoothed line per trial over its faint raw one, in the trial's mlflow.runColor; the
    run list beside it names every trial (`B=2Ki lr=...`) by batch size beside a chip of the same
    colour: the chart's key. No nesting to expand, no first-10 limit, no port to edit."""
    from selenium.webdriver.common.by import By

    _, folder, _, trials = sweep
    link = printed_link((folder / "ui.log").read_text(errors="replace").splitlines(), "every trial of sweep 'smoke'")
    assert link.startswith(f"http://127.0.0.1:{ui}/#/experiments/")
    reported = printed_link((folder / "sweep.out").read_text().splitlines(), "every trial's loss on one chart")
    assert reported.replace(f":{mlflow_ui.DEFAULT_PORT}/", f":{ui}/", 1) == link  # the same view
    browser.get(link)
    section = "loss against tokens (step)"
    wait(browser, lambda: section in text_of(browser), "the chart view's first section")

    def card(metric):
        found = browser.find_elements(
            By.XPATH, f"//*[@data-testid='experiment-view-compare-runs-card'][.//h4[normalize-space()='{metric}']]"
        )
        return found[0] if found else None

    def lines(metric, opaque):  # [(colour, path)] of the lines drawn: MLflow draws each run's twice,
        # the line shown opaque over the raw curve faint (the same path unless smoothed)
        drawn = card(metric).find_elements(By.CSS_SELECTOR, ".js-plotly-plot .scatterlayer path.js-line")
        found = [(p.get_attribute("style") or "", p.get_attribute("d") or "") for p in drawn]
        return sorted(
            (rgb(style.split("stroke: ", 1)[1]), d)
            for style, d in found
            if len(d) > 20 and ("stroke-opacity: 1;" in style) == opaque
        )

    def strokes(metric):  # the colours of the lines shown
        return [colour for colour, _ in lines(metric, True)]

    colours = sorted(rgb(run.tags[run_tags.RUN_COLOR_TAG]) for run in trials.values())
    wait(browser, lambda: card("train/loss") and strokes("train/loss") == colours, "a train/loss line per trial")
    assert [t.text for t in card("train/loss").find_elements(By.CSS_SELECTOR, ".g-xtitle")] == ["Step"]
    wait(browser, lambda: card("eval/loss") and strokes("eval/loss") == colours, "an eval/loss line per trial")
    shown, raw = ({d for _, d in lines("train/loss", opaque)} for opaque in (True, False))
    assert len(raw) == len(trials) and not shown & raw  # train/loss smoothed: no line shown is a raw curve
    assert {d for _, d in lines("eval/loss", True)} == {d for _, d in lines("eval/loss", False)}  # eval/loss raw
    # The key: the run list names each trial beside a chip of its colour, by batch size.
    listed = []
    for row in browser.find_elements(
        By.XPATH, "//*[@role='row'][.//*[@data-testid='experiment-view-table-run-color']]"
    ):
        chip = row.find_element(By.CSS_SELECTOR, "[data-testid='experiment-view-table-run-color']")
        name = next(n for n in trials if n in row.text)
        assert rgb(chip.value_of_css_property("background-color")) == rgb(trials[name].tags[run_tags.RUN_COLOR_TAG])
        listed.append(name)
    batches = [int(trials[name].params["batch.tokens_per_update"]) for name in listed]
    assert sorted(listed) == sorted(trials) and batches == sorted(batches), listed
    close = browser.find_elements(
        By.XPATH, "//*[normalize-space(text())='MLflow Assistant']/following::button[@aria-label='Close'][1]"
    )
    if close:  # MLflow opens its assistant on a first visit: it would hide a quarter of the page
        close[0].click()
        wait(browser, lambda: "MLflow Assistant" not in text_of(browser), "the assistant to close", timeout=10)
    browser.save_screenshot(str(tmp_path / "compare.png"))
    if os.environ.get("UI_SCREENSHOTS"):  # docs/images/: `UI_SCREENSHOTS=1 pytest ...test_ui_browser.py`
        from PIL import Image

        shot = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
        shot.quantize(colors=128).save(ROOT / "docs" / "images" / "mlflow_compare.png", optimize=True)  # small


def test_each_trial_carries_its_batch_sizes_colour_on_the_reports_scale(sweep):
    from orchestrator.reporting.batch_colours import batch_hex

    _, _, _, trials = sweep
    batches = sorted({int(r.params["batch.tokens_per_update"]) for r in trials.values()})
    assert len(batches) == 2
    for name, run in trials.items():
        assert run.tags[run_tags.RUN_COLOR_TAG] == batch_hex(int(run.params["batch.tokens_per_update"]), batches), name
