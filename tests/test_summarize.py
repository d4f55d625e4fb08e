"""``harness summarize``: one page across sweeps, read from each sweep's written leaderboard.json.

On copies of the committed default sweep (results/example): the complete one, one with a label's rows removed from
its leaderboard and a run missing on disk, one whose report never ran, one whose leaderboard stops at 50% of the
budget, and one posing as a paper sweep (its protocol fidelity and the paper's training come from configs/). The
rehearsal outputs of the paper sweeps are not used here: producing them takes minutes per sweep.
"""

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.report.across_sweeps import forest_figure, forest_rows, read_sweep_results
from harness.report.reported import load_reported

EXAMPLE = REPO_ROOT / "results" / "example"
# what summarize and the on-disk checks read: leaderboard.*, sweep.yaml, run.json, results.json
NOT_READ = shutil.ignore_patterns("figures", "report.html", "metrics.jsonl", "samples.jsonl", "lm_eval")
OUTPUTS = ["forest.png", "forest.svg", "summary.html", "summary.json", "summary.md"]


def copy_example(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(EXAMPLE, tmp_path / name, ignore=NOT_READ))


def edit_leaderboard(folder: Path, edit) -> dict:
    path = folder / "leaderboard.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    return record


def summarize(folders: list[Path], out: Path) -> dict:
    assert main(["summarize", *map(str, folders), "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def mean_rows(leaderboard: dict, ckpt: str = "ckpt-100") -> dict[str, dict]:
    """leaderboard.json's rows of Δ on the mean over benchmarks (sampled accuracy) at ``ckpt``, by label."""
    return {r["method"]: r for r in leaderboard["summary"] if r["ckpt"] == ckpt and r["bench"] == "all"
            and r["metric"] == "avg@4" and r["statistic"] == "mean" and r.get("diff") is not None}


def table_column(markdown: str, header_start: str, column: str) -> dict[str, str]:
    """The cells of ``column`` of the markdown table whose header line starts with ``header_start``, keyed by the
    row's claim (pipes inside cells are escaped as \\|, which no cell here holds)."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[header.index("claim")]] = cells[header.index(column)]
    return rows


def test_summary_of_the_committed_example(tmp_path):
    folder = copy_example(tmp_path, "example")
    leaderboard = json.loads((folder / "leaderboard.json").read_text())
    summary = summarize([folder], tmp_path / "out")

    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == OUTPUTS
    (sweep,) = summary["sweeps"]
    assert (sweep["setting"], sweep["state"], sweep["missing"], sweep["baseline"], sweep["ckpt"]) == (
        "example", "complete", [], "uniform", "ckpt-100")
    # one row per label against the baseline, the A/A pair included, each Δ and interval leaderboard.json's own
    expected = mean_rows(leaderboard)
    labels = [label for label in leaderboard["config"]["sweep"]["methods"] if label != "uniform"]
    assert [row["method"] for row in summary["forest"]] == labels == list(expected)
    for row in summary["forest"]:
        source = expected[row["method"]]
        assert [row[k] for k in ("diff", "diff_ci_low", "diff_ci_high", "verdict")] == [
            source[k] for k in ("diff", "diff_ci_low", "diff_ci_high", "verdict")]
        assert (row["baseline"], row["benchmark"], row["ckpt"]) == ("uniform", "mean", "ckpt-100")
        assert row["aa"] == (row["method"] == "uniform-aa")
        # the sweep's stand-in claims: +2 points for every method, parity within ±1 for the A/A pair
        (claim,) = row["claims"]
        assert (claim["kind"], claim["difference"]) == (("parity", 0.0) if row["aa"] else ("improvement", 2.0))
    # every claim with the sweep's own verdicts
    assert [(c["method"], c["headline"], c["verdict"]) for c in summary["claims"]] == [
        (c["method"], c["headline"], c["verdict"]) for c in leaderboard["claims"]]
    # the training reached, read from leaderboard.json's spend columns, reads as the sweep's own claims table has it
    column = "trained here (method; baseline)"
    ours = table_column((tmp_path / "out" / "summary.md").read_text(), "| setting | claim |", column)
    theirs = table_column((folder / "leaderboard.md").read_text(), "| claim |", column)
    assert theirs and all(ours[claim] == theirs[claim] for claim in theirs)
    page = (tmp_path / "out" / "summary.md").read_text()
    assert "Nothing missing: every sweep is complete." in page and "![Δ per method and setting" in page
    # the figure holds every row: its labels are the SVG's text
    svg = (tmp_path / "out" / "forest.svg").read_text()
    assert all(f"example: {label} vs uniform" in svg for label in labels)


def test_forest_figure_draws_the_leaderboard_values(tmp_path):
    folder = copy_example(tmp_path, "example")
    (result,) = read_sweep_results([folder])
    rows = forest_rows(result)
    ax = forest_figure(rows).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [row.label for row in rows]
    expected = mean_rows(result.leaderboard)
    for y, (row, bars) in enumerate(zip(rows, ax.containers, strict=True)):
        point, _, (interval,) = bars.lines
        ((low, y_low), (high, _)) = interval.get_segments()[0]
        assert (point.get_xdata()[0], point.get_ydata()[0], y_low) == pytest.approx(
            (100 * expected[row.method]["diff"], y, y))
        assert (low, high) == pytest.approx((100 * expected[row.method]["diff_ci_low"],
                                             100 * expected[row.method]["diff_ci_high"]))


def test_partial_sweeps_are_listed_with_what_they_lack(tmp_path):
    partial = copy_example(tmp_path, "partial")  # nat's run failed: the report left it out
    edit_leaderboard(partial, lambda lb: lb.update(summary=[r for r in lb["summary"] if r["method"] != "nat"],
                                                   claims=[c for c in lb["claims"] if c["method"] != "nat"]))
    (partial / "runs" / "nat" / "seed1" / "run.json").unlink()
    unreported = copy_example(tmp_path, "unreported")  # every run done, the report not yet run
    (unreported / "leaderboard.json").unlink()
    early = copy_example(tmp_path, "early")  # a leaderboard without the full budget's checkpoint
    leaderboard = edit_leaderboard(early, lambda lb: lb.update(
        summary=[r for r in lb["summary"] if r["ckpt"] != "ckpt-100"]))

    summary = summarize([partial, unreported, early], tmp_path / "out")

    sweeps = {s["setting"]: s for s in summary["sweeps"]}
    assert {name: s["state"] for name, s in sweeps.items()} == {
        "partial": "partial", "unreported": "not reported", "early": "partial"}
    assert sweeps["partial"]["missing"][0] == "label `nat`: not in leaderboard.json"
    assert sweeps["partial"]["missing"][1].startswith("`nat` train: missing for seed(s) 1 (no log")
    assert len(sweeps["partial"]["missing"]) == 2
    assert sweeps["unreported"]["missing"] == [
        "no leaderboard.json: `harness report` has not run on this sweep (or failed)",
        "every run and evaluation is on disk: `harness report` would write the leaderboard"]
    assert sweeps["early"]["missing"][-1] == ("the full budget (ckpt-100) is not in leaderboard.json: the "
                                              "differences below are at ckpt-050")
    assert sweeps["early"]["ckpt"] == "ckpt-050"
    # rows only where a leaderboard has them: the partial sweep's without nat, the early one's at ckpt-050
    forest = [(row["setting"], row["method"]) for row in summary["forest"]]
    assert ("partial", "nat") not in forest and not any(setting == "unreported" for setting, _ in forest)
    assert len(forest) == 6 + 7
    at_half = mean_rows(leaderboard, "ckpt-050")
    for row in (r for r in summary["forest"] if r["setting"] == "early"):
        assert (row["ckpt"], row["diff"], row["diff_ci_low"], row["diff_ci_high"]) == (
            "ckpt-050", *(at_half[row["method"]][k] for k in ("diff", "diff_ci_low", "diff_ci_high")))
    page = (tmp_path / "out" / "summary.md").read_text()
    missing = page.split("## Missing parts")[1].split("\n## ")[0]
    assert f"- `partial` ({partial}):\n  - label `nat`: not in leaderboard.json" in missing
    assert f"- `unreported` ({unreported}):\n  - no leaderboard.json" in missing


def test_a_paper_sweeps_fidelity_departures_and_training_are_footnoted(tmp_path):
    """A copy posing as paper-ktae: its fidelity is checked against the configuration its leaderboard.json holds
    (the tiny preset: nearly every element departs), the paper's run comes from configs/reported/paper-ktae.yaml,
    and a claim on another comparison (greedy) gets a row of its own."""
    folder = copy_example(tmp_path, "paper-ktae")

    def as_paper_sweep(lb):
        lb["config"]["sweep"]["name"] = "paper-ktae"
        lb["claims"][0]["metric"] = "greedy"  # entropy's claim, now on the greedy comparison

    leaderboard = edit_leaderboard(folder, as_paper_sweep)
    summary = summarize([folder, copy_example(tmp_path, "example")], tmp_path / "out")

    paper = summary["sweeps"][0]
    assert paper["fidelity"]["verdict"].startswith("simplified comparison, not a reproduction")
    assert {d["element"] for d in paper["fidelity"]["departures"]} >= {"model", "batch", "lr", "max_length"}
    training = load_reported(CONFIG_DIR / "reported" / "paper-ktae.yaml").training
    assert paper["paper_training"]["rollouts"] == training.rollouts and summary["sweeps"][1]["fidelity"] is None
    greedy = [row for row in summary["forest"] if row["metric"] == "greedy"]
    assert [(row["setting"], row["method"], row["label"]) for row in greedy] == [
        ("paper-ktae", "entropy", "paper-ktae: entropy vs uniform (greedy, mean)")]
    claim = leaderboard["claims"][0]
    assert [greedy[0][k] for k in ("diff", "diff_ci_low", "diff_ci_high", "verdict")] == [
        claim[k] for k in ("diff", "diff_ci_low", "diff_ci_high", "headline")]
    sampled_entropy = next(r for r in summary["forest"] if r["setting"] == "paper-ktae" and r["method"] == "entropy"
                           and r["metric"] == "avg@4")
    assert sampled_entropy["claims"] == []
    page = (tmp_path / "out" / "summary.md").read_text()
    assert "| paper-ktae [^1] |" in page and "| example |" in page
    assert "[^1]: `paper-ktae`: simplified comparison, not a reproduction" in page
    assert f"{training.rollouts / 1e6:.3g}M rollouts" in page  # the paper's run beside each of its claims
    html = (tmp_path / "out" / "summary.html").read_text()
    assert "<li id=\"fn-1\" value=\"1\"><code>paper-ktae</code>" in html and "href=\"#fn-1\"" in html


def test_a_leaderboard_this_checkout_cannot_validate_still_reads(tmp_path):
    """A sweep reported under an older schema: its differences and claims still read; the checks that need its
    configuration (fidelity, run files) are named as skipped."""
    folder = copy_example(tmp_path, "older")
    edit_leaderboard(folder, lambda lb: lb["config"]["preset"]["train"].update(retired_key=1))
    summary = summarize([folder], tmp_path / "out")
    (sweep,) = summary["sweeps"]
    assert sweep["state"] == "partial" and len(summary["forest"]) == 7
    assert sweep["missing"][0].startswith("this checkout cannot read the sweep's configuration, so its protocol "
                                          "fidelity and run files are not checked: ")
    assert "retired_key" in sweep["missing"][0]


def test_a_folder_that_is_not_a_sweep_is_refused_by_name(tmp_path, capsys):
    stray = tmp_path / "notes"
    stray.mkdir()
    (stray / "readme.txt").write_text("not a sweep")
    assert main(["summarize", str(EXAMPLE), str(stray), "--out", str(tmp_path / "out")]) == 2
    assert f"harness summarize: error: {stray} is not a sweep result folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    assert main(["summarize", str(tmp_path / "nosuch"), "--out", str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'nosuch'}: no such folder" in capsys.readouterr().err

    (stray / "leaderboard.json").write_text(json.dumps({"rows": []}))
    assert main(["summarize", str(stray), "--out", str(tmp_path / "out")]) == 2
    assert f"{stray / 'leaderboard.json'}: not a leaderboard written by `harness report`" in capsys.readouterr().err
