"""The view that compares a sweep's trials in MLflow's UI: the experiment page's chart view with
every trial visible, `train/loss` (smoothed) and `eval/loss` first, against step (= tokens seen),
each run in its mlflow.runColor (its batch size's colour), and beside the charts the run list by
batch size, each run's name (`B=2Ki lr=1e-3 ...`) beside a chip of its colour: the key (a chart
card's own legend shows two runs at a time).

URL parameters cannot set that page's charts, x axis, smoothing or run visibility; MLflow's
shared view state can (MLflow 3.17, mlflow/server/js/src/experiment-tracking/components/
experiment-page/hooks/useSharedExperimentViewState.ts): an experiment tag
`mlflow.sharedViewState.<key>` holding the page's state as JSON, which
`#/experiments/<id>/runs?viewStateShareKey=<key>` opens. The state is the search facets
(ExperimentPageSearchFacetsState: which runs, in which order) and the UI state
(models/ExperimentPageUIState.tsx: the chart cards and their sections, run visibility, the line
charts' global settings). MLflow 3.17.2 lays it over its defaults, ignores the explicit run lists
(runsExpanded, runsPinned, runsHidden, runsVisibilityMap: a view shows runs by its filter and
runsHiddenMode) and ignores the whole state when the link already carries search facets
(searchFilter, orderByKey, ...): the link carries none. docs/mlflow.md says what it opens."""

from __future__ import annotations

import json
from typing import Any, Dict, Sequence

from orchestrator.tracking.run_tags import PARENT_TAG
from orchestrator.tracking.store import Store, quoted

VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow's EXPERIMENT_PAGE_VIEW_STATE_SHARE_TAG_PREFIX
COMPARED_METRICS = ("train/loss", "eval/loss")
SMOOTHING = 60
"""The smoothing of the page's line charts, MLflow's slider from 0 (raw) to 100 (MLflow draws
the raw curve faint behind the smoothed one): enough that a trial's trend reads through its
per-update train/loss, each point one batch's mean loss."""
UNSMOOTHED = ("eval/loss",)
"""Drawn raw: already a mean over the evaluation set, with few points that an average would drag."""
ORDER_BY = "metrics.`train/tokens_per_update`"
"""The run list by batch size (the metric every update logs; params sort as text, 16Ki before
2Ki): read top to bottom, its colour chips are the scale from the smallest batch to the largest."""
MAX_LISTED = 300
"""The most run ids a view's filter lists: MLflow keeps 20,000 characters per experiment tag, and
an id in the filter takes 36 of them."""
SECTION = "orchestrator-compare"  # the uuid of the section holding the compared charts


def view_key(source_run_id: str) -> str:
    """The share key of a sweep's (or a run's) view: one per source run, so writing it again
    replaces it rather than adding a tag per report."""
    return f"orchestrator-{source_run_id}"


def run_filter(uri: str, source_run_id: str, run_ids: Sequence[str]) -> str:
    """The runs search filter that lists `run_ids`: the sweep's child runs by their parent when
    they are all of them (a trial that starts later then shows up too), else by id (a sweep that
    reused earlier sweeps' runs, a single run); past MAX_LISTED ids, the child runs only."""
    if len(run_ids) > MAX_LISTED:  # not searched again: at thousands of runs, seconds of MLflow's
        return f"tags.`{PARENT_TAG}` = {quoted(source_run_id)}"
    children = {r.run_id for r in Store(uri).child_runs(source_run_id)}
    if children and children == set(run_ids):
        return f"tags.`{PARENT_TAG}` = {quoted(source_run_id)}"
    return f"attributes.run_id IN ({', '.join(quoted(r) for r in run_ids)})"


def _line_chart(metric: str) -> Dict[str, Any]:
    """A line chart card of `metric` against step (MLflow's RunsChartsLineCardConfig, serialized);
    the x axis and smoothing are the page's global ones, so one setting moves every chart (but
    the UNSMOOTHED ones' smoothing)."""
    smoothed = metric not in UNSMOOTHED
    return {
        "uuid": f"orchestrator-{metric}",
        "type": "LINE",
        "metricSectionId": SECTION,
        "isGenerated": False,
        "deleted": False,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "lineSmoothness": SMOOTHING if smoothed else 0,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": smoothed,
        "yAxisKey": "metric",
        "range": {},
    }


def view_state(search_filter: str, metrics: Sequence[str] = COMPARED_METRICS) -> Dict[str, Any]:
    """The shared view state: the runs `search_filter` lists, every one of them visible (MLflow
    shows the first 10 otherwise), by batch size; `metrics`' charts in a first section of their
    own. The page adds a chart for every other metric, in sections after it
    (isAccordionReordered keeps that order: MLflow sorts unordered sections by name)."""
    return {
        "searchFilter": search_filter,
        "orderByKey": ORDER_BY,
        "orderByAsc": True,
        "runsHiddenMode": "SHOW_ALL",
        "runListHidden": False,
        "compareRunCharts": [_line_chart(m) for m in metrics],
        "compareRunSections": [
            {
                "uuid": SECTION,
                "name": "loss against tokens (step)",
                "display": True,
                "isReordered": True,
                "deleted": False,
                "isGenerated": False,
                "columns": len(metrics),  # the compared charts side by side
                "cardHeight": 440,  # MLflow's 360 and more: each card's legend takes its lower part
            }
        ],
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
        "globalLineChartConfig": {"xAxisKey": "step", "selectedXAxisMetricKey": "", "lineSmoothness": SMOOTHING},
    }


def write(uri: str, source_run_id: str, run_ids: Sequence[str]) -> str:
    """Write the view of `run_ids` (a sweep's trials; `source_run_id` its parent run, or the one
    run reported) as a tag of their experiment; returns the share key. Writing it again with the
    same runs writes the same value."""
    store = Store(uri)
    experiment = store.get_run(source_run_id).experiment_id
    key = view_key(source_run_id)
    state = view_state(run_filter(uri, source_run_id, run_ids))
    store.set_experiment_tag(experiment, VIEW_TAG_PREFIX + key, json.dumps(state, separators=(",", ":")))
    return key
