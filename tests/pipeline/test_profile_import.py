"""Bring your own lengths (`profile.source: file`, asp.io.lengths + asp.pipeline.profile_import).

The stage reading a JSONL of the generated samples writes byte-identical outputs/profile files to the generating
run's; every dump format (plain JSONL with lengths, CSV with ids, Parquet with token-id lists and with chat messages,
verl / OpenRLHF / TRL dumps of prompt + response text counted with the policy's tokenizer) is read by naming its
fields; every bad record is one UserError naming the file and line/row, with nothing written; the simulate stage
skips a profile without timings and says why. The end-to-end `dvc repro` of a user JSONL: test_profile_import_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from asp.config import LengthsFileParams
from asp.demo.task import generate_problems
from asp.errors import UserError
from asp.io.lengths import match_samples, parse_records, read_rollouts
from asp.pipeline import profile
from asp.pipeline.profile_import import prepared_prompts
from asp.steps.loaders import load_policy_tokenizer
from asp.steps.paths import rebase
from asp.tracking import NullTracker

from .conftest import Built, make_params, write_prompts

CAP = 8
ROLES = {"profile": [0, 1, 2, 3], "heldout": [4, 5], "train": [0, 1, 2, 3, 4, 5, 6]}
RECORDS = generate_problems(8, seed=3)  # 6 profiled (profile + held-out), 1 for training only, 1 not prepared


def _prepared(root: Path, template: Any = str) -> profile.Paths:
    paths = rebase(profile.Paths(), root)
    write_prompts(paths.prompts, RECORDS, ROLES, template)
    return paths


def _params(cap: int = CAP, **lengths: Any) -> Any:
    return make_params({"profile": {"source": "file", "max_new_tokens": cap, "lengths": lengths}})


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prompts_frame(paths: profile.Paths) -> pd.DataFrame:
    return prepared_prompts(paths.prompts)


def _plain_rows() -> list[dict[str, Any]]:
    """One record per prompt (the 6 prepared and 2 others), two lengths each; prompt 0 twice (a third sample)."""
    rows = [{"prompt": r["problem"], "length": [i % CAP + 1, 3]} for i, r in enumerate(RECORDS)]
    return [*rows, {"prompt": RECORDS[0]["problem"], "length": 8}]


# ----------------------------------------------------------------------------------------- the same outputs


def test_imported_generated_samples_give_byte_identical_profile_outputs(tmp_path: Path, demo_policy: Built) -> None:
    """Generate (tiny policy, 6 prompts x 2 samples), dump the samples as a user would (prompt text, a list of
    lengths and finish reasons per prompt), import the dump: samples.parquet and prompts.parquet are the same bytes,
    metrics agree on every length statistic, the timings CSV holds its header only."""
    tok = load_policy_tokenizer(demo_policy.paths.out_dir)

    def template(problem: str) -> str:
        return tok.apply_chat_template(
            [{"role": "user", "content": problem}], tokenize=False, add_generation_prompt=True
        )

    gen = rebase(profile.Paths(policy=demo_policy.paths.out_dir), tmp_path / "gen")
    write_prompts(gen.prompts, RECORDS, ROLES, template)
    knobs = {"n_samples": 2, "max_new_tokens": CAP, "minibatch_prompts": 2, "chunk_minibatches": 1}
    generated = profile.run(make_params({"profile": knobs}), gen, NullTracker())
    samples = pd.read_parquet(gen.out_dir / "samples.parquet")
    prepared = prepared_prompts(gen.prompts)
    text = dict(zip(prepared["prompt_id"], prepared["prompt"], strict=True))
    dump = [
        {"prompt": text[pid], "length": g["length"].tolist(), "finish": g["finish_reason"].tolist()}
        for pid, g in samples.groupby("prompt_id", sort=False)
    ]
    imp = rebase(profile.Paths(policy=demo_policy.paths.out_dir, prompts=gen.prompts), tmp_path / "imp")
    source = _jsonl(tmp_path / "rollouts.jsonl", dump[::-1])  # any record order
    params = make_params(
        {"profile": {**knobs, "source": "file", "lengths": {"path": str(source), "finish_reason_field": "finish"}}}
    )
    imported = profile.run(params, imp, NullTracker())
    for name in ("samples.parquet", "prompts.parquet"):
        assert (imp.out_dir / name).read_bytes() == (gen.out_dir / name).read_bytes(), name
    same = ("prompts", "samples", "mean_length", "median_length", "p99_length", "truncation_rate")
    assert {k: imported[f"profile/{k}"] for k in same} == {k: generated[f"profile/{k}"] for k in same}
    assert "profile/tokens_per_s" not in imported and imported["profile/file_responses_unmatched"] == 0
    assert pd.read_csv(imp.timings).empty and list(pd.read_csv(imp.timings).columns) == profile.TIMING_COLUMNS
    assert imp.plot.is_file() and json.loads(imp.metrics.read_text()) == pytest.approx(imported)


# --------------------------------------------------------------------------------------------- dump formats


def test_plain_jsonl_of_prompt_and_lengths(tmp_path: Path) -> None:
    paths = _prepared(tmp_path)
    src = _jsonl(tmp_path / "r.jsonl", _plain_rows())
    spec = LengthsFileParams(path=str(src))
    samples, report = match_samples(parse_records(read_rollouts(src), spec, CAP), _prompts_frame(paths), str(src))
    assert samples["prompt_id"].unique().tolist() == ["q000", "q001", "q002", "q003", "q004", "q005"]
    first = samples[samples["prompt_id"] == "q000"]
    assert first["sample"].tolist() == [0, 1, 2] and first["length"].tolist() == [1, 3, 8]
    assert first["finish_reason"].tolist() == ["stop", "stop", "length"]  # at the cap: truncated
    assert (report["responses_train_only"], report["responses_unmatched"]) == (2, 2)
    assert report["profile_prompts_with_lengths"] == 4
    assert samples.columns.tolist() == ["prompt_id", "role", "sample", "length", "finish_reason"]


def test_csv_matched_by_prompt_id(tmp_path: Path) -> None:
    paths = _prepared(tmp_path)
    src = tmp_path / "r.csv"
    pd.DataFrame({"id": ["q000", "q004", "q004", "zzz"], "len": [5, 2, 7, 3]}).to_csv(src, index=False)
    spec = LengthsFileParams(path=str(src), prompt_field=None, id_field="id", length_field="len")
    samples, report = match_samples(parse_records(read_rollouts(src), spec, CAP), _prompts_frame(paths), str(src))
    assert samples[["prompt_id", "role", "sample", "length"]].values.tolist() == [
        ["q000", "profile", 0, 5],
        ["q004", "heldout", 0, 2],
        ["q004", "heldout", 1, 7],
    ]
    assert report["heldout_prompts_without_lengths"] == 1 and report["responses_unmatched"] == 1


def test_parquet_with_token_id_lists_and_steps(tmp_path: Path) -> None:
    """Token ids (one list, or a list of lists per record) count as lengths; min_step keeps the newer records."""
    paths = _prepared(tmp_path)
    src = tmp_path / "r.parquet"
    pd.DataFrame(
        {
            "problem": [RECORDS[0]["problem"], RECORDS[4]["problem"], RECORDS[0]["problem"]],
            "ids": [[[1, 2, 3], [4]], [[7, 7]], [[5, 5, 5, 5, 5]]],
            "step": [3, 4, 1],
        }
    ).to_parquet(src)
    spec = LengthsFileParams(
        path=str(src), prompt_field="problem", length_field=None, token_ids_field="ids", step_field="step", min_step=2
    )
    samples, report = match_samples(parse_records(read_rollouts(src), spec, CAP), _prompts_frame(paths), str(src))
    assert samples["length"].tolist() == [3, 1, 2]  # the step-1 record is dropped
    assert report["records_skipped_by_step"] == 1 and (report["step_min"], report["step_max"]) == (3, 4)


def _text_dump_samples(tmp_path: Path, demo_policy: Built, rows: list[dict[str, Any]], **fields: Any) -> pd.DataFrame:
    paths = rebase(profile.Paths(policy=demo_policy.paths.out_dir), tmp_path)
    write_prompts(paths.prompts, RECORDS, ROLES)
    src = tmp_path / ("r.parquet" if fields.pop("parquet", False) else "r.jsonl")
    if src.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(src)
    else:
        _jsonl(src, rows)
    params = _params(48, path=str(src), length_field=None, **fields)
    profile.run(params, paths, NullTracker())
    return pd.read_parquet(paths.out_dir / "samples.parquet")


def _tokens(demo_policy: Built, text: str) -> int:
    return len(load_policy_tokenizer(demo_policy.paths.out_dir)(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize(
    ("name", "prompt", "response", "step"),
    [
        ("verl", "input", "output", "step"),
        ("openrlhf", "input", "output", None),
        ("trl", "prompt", "completion", "step"),
    ],
)
def test_framework_dumps_of_prompt_and_response_text(
    tmp_path: Path, demo_policy: Built, name: str, prompt: str, response: str, step: str | None
) -> None:
    """verl's rollout_data_dir JSONL (input, output, score, step), OpenRLHF's batch_inference JSONL (input, output)
    and TRL's completions table (step as text, prompt, completion): templated prompts holding the problem, response
    text counted with the policy's tokenizer."""
    outputs = ["x = 3 + 4", "the answer is 12", "7"]
    rows = [
        {
            prompt: f"<|system|>You are a helpful assistant.\n<|user|>{RECORDS[i]['problem']}\n<|assistant|>",
            response: outputs[i % 3],
            "score": 1.0,
            **({step: str(i) if name == "trl" else i} if step else {}),
        }
        for i in (0, 4, 7)
    ]
    samples = _text_dump_samples(
        tmp_path, demo_policy, rows, prompt_field=prompt, response_field=response, step_field=step, match="contains"
    )
    assert samples["prompt_id"].tolist() == ["q000", "q004"]  # record 7 is no prepared prompt
    assert samples["length"].tolist() == [_tokens(demo_policy, outputs[0]), _tokens(demo_policy, outputs[1])]


def test_verl_generation_parquet_with_chat_messages_and_response_lists(tmp_path: Path, demo_policy: Built) -> None:
    """verl's main_generation output: `prompt` as chat messages, `responses` as a list of n texts."""
    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": RECORDS[i]["problem"]}],
            "responses": ["12", "twelve and more"],
        }
        for i in (1, 5)
    ]
    samples = _text_dump_samples(
        tmp_path, demo_policy, rows, parquet=True, prompt_field="prompt", response_field="responses"
    )
    assert samples[["prompt_id", "sample"]].values.tolist() == [["q001", 0], ["q001", 1], ["q005", 0], ["q005", 1]]
    assert samples["length"].tolist()[:2] == [_tokens(demo_policy, "12"), _tokens(demo_policy, "twelve and more")]


def _frame(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """Prepared prompts (prompt_id, problem, role); the templated prompt wraps the problem in <u>...</u>."""
    ids, problems, roles = zip(*rows, strict=True)
    return pd.DataFrame(
        {"prompt_id": ids, "problem": problems, "prompt": [f"<u>{p}</u>" for p in problems], "role": roles}
    )


def _match(prompts: pd.DataFrame, texts: list[str], match: str = "exact") -> tuple[pd.DataFrame, dict[str, Any]]:
    records = [(f"f line {i + 1}", {"prompt": t, "length": i + 1}) for i, t in enumerate(texts)]
    return match_samples(parse_records(records, LengthsFileParams(path="f"), CAP), prompts, "f", match)


def test_matching_exact_contains_train_only_and_duplicated_texts() -> None:
    """exact: a problem or the templated prompt (whitespace aside); contains: the longest prepared problem inside
    the text, searched over every prepared prompt, so a train-only prompt's record is not taken for a shorter
    profiled problem it contains; a text prepared twice (here: whitespace aside) gives the record to one of its ids."""
    prompts = _frame(
        [("a", "A3 B4", "profile"), ("b", "A1  B2", "heldout"), ("c", "A1 B2", "heldout"), ("d", "A3 B4 C5", "train")]
    )
    samples, report = _match(prompts, ["A3 B4", "<u>A1 B2</u>", "sys: A3 B4 C5 :end", "sys: A3 B4 :end"])
    assert samples[["prompt_id", "length"]].values.tolist() == [["a", 1], ["b", 2]]
    assert (report["responses_matched"], report["responses_unmatched"]) == (2, 2)
    samples, report = _match(prompts, ["A3 B4", "<u>A1 B2</u>", "sys: A3 B4 C5 :end", "sys: A3 B4 :end"], "contains")
    assert samples[["prompt_id", "length"]].values.tolist() == [["a", 1], ["a", 4], ["b", 2]]
    assert (report["responses_matched"], report["responses_train_only"], report["responses_unmatched"]) == (3, 1, 0)


def test_a_repeated_text_gives_each_record_to_one_prompt_in_turn() -> None:
    """Issue 39: a text under several prompt ids (the demo's 'Add mod 10: A3' has 21) gave every record to every id.
    Now the records of that text are dealt in turn: T's 1st record -> a, 2nd -> b, 3rd -> a; one prompt each, so the
    four records make four samples (not 1 + 2 + 1 + 2 + 1 + ...)."""
    prompts = _frame([("a", "T", "profile"), ("b", "T", "profile"), ("c", "U", "heldout"), ("d", "U", "train")])
    samples, report = _match(prompts, ["T", "T", "T", "U", "U"])
    assert samples[["prompt_id", "length"]].values.tolist() == [["a", 1], ["a", 3], ["b", 2], ["c", 4]]
    assert (report["responses_matched"], report["responses_train_only"], report["responses_unmatched"]) == (4, 1, 0)


def test_a_text_of_both_profiled_and_heldout_prompts_is_refused_naming_id_field() -> None:
    """Responses to one text on both sides of the tau gate would leak held-out targets into training."""
    prompts = _frame([("a", "Add mod 10: A3", "profile"), ("b", "Add mod 10: A3", "heldout"), ("c", "U", "heldout")])
    with pytest.raises(UserError) as err:
        _match(prompts, ["Add mod 10: A3", "U"])
    text = str(err.value)
    assert text.startswith("f: the prompt text 'Add mod 10: A3' is the text of 2 prepared prompts (ids a, b)"), text
    assert "profile.lengths.id_field" in text and "held-out" in text


def test_a_folder_of_rollout_files_is_read_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "rollouts"
    _jsonl(folder / "b.jsonl", [{"prompt": "two", "length": 2}])
    _jsonl(folder / "a.jsonl", [{"prompt": "one", "length": 1}])
    (folder / "c.json").write_text(json.dumps({"data": [{"prompt": "three", "length": 3}]}))  # a JSON list (or data:)
    (folder / "README.md").write_text("not read")
    records = read_rollouts(folder)
    assert [w.split("/")[-1] for w, _ in records] == ["a.jsonl line 1", "b.jsonl line 1", "c.json record 0"]
    assert parse_records(records, LengthsFileParams(path=str(folder)), CAP).length == [1, 2, 3]


# -------------------------------------------------------------------------------------------- bad records


@pytest.mark.parametrize(
    ("rows", "fields", "where", "says"),
    [
        ([{"prompt": "p", "length": 0}], {}, "line 2", "must be positive"),
        ([{"prompt": "p", "length": [4, -2]}], {}, "line 2", "response length -2"),
        ([{"prompt": "p", "length": "12"}], {}, "line 2", "holds '12', not a response length"),
        ([{"prompt": "p", "length": 4.5}], {}, "line 2", "holds 4.5, not a response length"),
        ([{"prompt": "p", "length": None}], {}, "line 2", "'length' is empty"),
        ([{"prompt": "p", "length": CAP + 1}], {}, "line 2", "longer than profile.max_new_tokens (8)"),
        ([{"prompt": "   ", "length": 3}], {}, "line 2", "empty prompt"),
        ([{"prompt": "p", "n": 3}], {}, "line 2", "no 'length' field (fields present: prompt, n)"),
        (
            [{"id": "q000", "prompt": "other text", "length": 3}],
            {"id_field": "id"},
            "line 2",
            "prompt id 'q000' comes with a different prompt than at",
        ),
        ([{"prompt": "p", "out": ""}], {"length_field": None, "response_field": "out"}, "line 2", "empty response"),
        ([{"prompt": "p", "length": 3, "fr": "eos"}], {"finish_reason_field": "fr"}, "line 2", "stop/length"),
        ([{"prompt": "p", "length": 3, "step": "late"}], {"step_field": "step"}, "line 2", "not a policy step"),
    ],
)
def test_a_bad_record_is_named_by_file_and_line_and_nothing_is_written(
    tmp_path: Path, demo_policy: Built, rows: list[dict[str, Any]], fields: dict[str, Any], where: str, says: str
) -> None:
    paths = rebase(profile.Paths(policy=demo_policy.paths.out_dir), tmp_path)
    write_prompts(paths.prompts, RECORDS, ROLES)
    good = {"id": "q000", "prompt": RECORDS[0]["problem"], "length": 2, "out": "ok", "fr": "stop", "step": 1}
    src = _jsonl(tmp_path / "r.jsonl", [good, *rows])
    with pytest.raises(UserError) as err:
        profile.run(_params(path=str(src), **fields), paths, NullTracker())
    assert f"{src} {where}:" in str(err.value) and says in str(err.value), str(err.value)
    assert not paths.out_dir.exists() and not paths.metrics.exists() and not paths.timings.exists()


def test_parquet_rows_are_named_0_based_and_csv_lines_after_the_header(tmp_path: Path) -> None:
    spec = LengthsFileParams(path="x")
    pq, csv = tmp_path / "r.parquet", tmp_path / "r.csv"
    pd.DataFrame({"prompt": ["a", "b"], "length": [3, -1]}).to_parquet(pq)
    pd.DataFrame({"prompt": ["a", "b"], "length": [3, -1]}).to_csv(csv, index=False)
    with pytest.raises(UserError, match=rf"{pq} row 1: response length -1"):
        parse_records(read_rollouts(pq), spec, CAP)
    with pytest.raises(UserError, match=rf"{csv} line 3: response length -1"):
        parse_records(read_rollouts(csv), spec, CAP)


def test_no_overlap_with_the_prepared_prompts(tmp_path: Path) -> None:
    paths = _prepared(tmp_path)
    src = _jsonl(tmp_path / "r.jsonl", [{"prompt": "What is the capital of France?", "length": 4}])
    with pytest.raises(UserError, match="none of its 1 records matches one of the 4 profile or 2 heldout prompts"):
        profile.run(_params(path=str(src)), paths, NullTracker())
    only_profile = _jsonl(tmp_path / "p.jsonl", [{"prompt": RECORDS[0]["problem"], "length": 4}])
    with pytest.raises(UserError, match="none of its 1 records matches one of the 2 heldout prompts"):
        profile.run(_params(path=str(only_profile)), paths, NullTracker())
    assert not paths.out_dir.exists()


def test_params_name_exactly_one_length_source_and_a_prompt() -> None:
    with pytest.raises(ValueError, match="exactly one of length_field, token_ids_field, response_field"):
        LengthsFileParams(response_field="output")
    with pytest.raises(ValueError, match="prompt_field or id_field"):
        LengthsFileParams(prompt_field=None)
    with pytest.raises(ValueError, match="min_step needs step_field"):
        LengthsFileParams(min_step=3)


def test_missing_file_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found. Set profile.lengths.path"):
        read_rollouts(tmp_path / "nope.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no rollout files"):
        read_rollouts(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- simulate


def test_simulate_skips_a_profile_without_timings_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from asp.pipeline import simulate

    paths = rebase(simulate.Paths(), tmp_path)
    paths.timings.parent.mkdir(parents=True)
    pd.DataFrame(columns=profile.TIMING_COLUMNS).to_csv(paths.timings, index=False)
    assert simulate.run(make_params(), paths, NullTracker()) == {"simulate/enabled": 0}
    models = json.loads((paths.out_dir / "models.json").read_text())
    assert models["enabled"] is False and "profile.source: file" in models["skipped"]
    assert "[simulate] skipped: no generated profile" in capsys.readouterr().err
    with pytest.raises(UserError, match="cannot simulate: no generated profile"):
        simulate.fit_models(make_params(), paths)
