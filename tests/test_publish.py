"""``tandem-rlvr push``: the model card from a recorded run (tests/fixtures/publish: the config.yaml and
metrics.jsonl of a 2-step world trlvr run with validation, and the eval.json of `tandem-rlvr eval` on its
final/ and a second senior), the upload through a fake HfApi, and the refusals. No network: every socket
connection fails in this file, and ``huggingface_hub.HfApi`` is replaced by a recorder."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
from pathlib import Path

import pytest
import yaml

from helpers.paths import ROOT
from helpers.tiny_models import make_tiny_model

FIXTURE = ROOT / "tests" / "fixtures" / "publish"
SECRET = "hf_SECRETtokenNEVERprinted123"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No real network call can happen here, whatever the code under test tries."""
    def refuse(*_a, **_k):
        raise AssertionError("a test of tandem-rlvr push tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("HF_TOKEN", raising=False)


class FakeApi:
    """Records every call; ``upload_folder`` records what the real one would send (the same pattern filter)."""

    calls: list = []
    fail: Exception | None = None
    public_repos: set = set()  # repositories that already exist and are public

    def __init__(self, token=None, **_kw):
        FakeApi.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id, **kw):
        FakeApi.calls.append(("create_repo", {"repo_id": repo_id, **kw}))

    def repo_info(self, repo_id, **kw):
        FakeApi.calls.append(("repo_info", {"repo_id": repo_id, **kw}))
        return type("ModelInfo", (), {"private": repo_id not in FakeApi.public_repos})()

    def create_branch(self, repo_id, **kw):
        FakeApi.calls.append(("create_branch", {"repo_id": repo_id, **kw}))

    def upload_folder(self, *, repo_id, folder_path, allow_patterns=None, ignore_patterns=None, **kw):
        from huggingface_hub.utils import filter_repo_objects

        if FakeApi.fail is not None:
            raise FakeApi.fail
        root = Path(folder_path)
        present = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        sent = list(filter_repo_objects(present, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
        files = {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in sent}
        FakeApi.calls.append(("upload_folder", {"repo_id": repo_id, "files": files,
                                                "card": (root / "README.md").read_text(), **kw}))
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/abc"})()


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub

    FakeApi.calls, FakeApi.fail, FakeApi.public_repos = [], None, set()
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    return FakeApi


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _snapshot(run: Path) -> dict:
    return {p.relative_to(run).as_posix(): (_sha(p), p.stat().st_mtime_ns) for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture
def run(tmp_path, tokenizer):
    """The recorded run's config.yaml and metrics.jsonl, with final/ and best/ written as the trainer does."""
    from tandem_rlvr.training.checkpoint import save_model

    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(FIXTURE / "run" / name, run / name)
    save_model(make_tiny_model(len(tokenizer), 0), tokenizer, run / "final")
    save_model(make_tiny_model(len(tokenizer), 1), tokenizer, run / "best",
               extra_json={"best.json": {"metric": "val/pass@1", "value": 0.125, "step": 1}})
    return run


@pytest.fixture
def eval_dir(tmp_path, run):
    """The recorded eval.json, its senior `trlvr` evaluated from this run's final/."""
    out = tmp_path / "eval_out"
    out.mkdir()
    text = (FIXTURE / "eval" / "eval.json").read_text().replace('"RUN/final"', json.dumps(str(run / "final")))
    (out / "eval.json").write_text(text)
    return out


def _push(capsys, *argv):
    from tandem_rlvr.cli import main

    code = main(["push", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _card_parts(card: str) -> tuple[dict, str]:
    _, meta, body = card.split("---\n", 2)
    return yaml.safe_load(meta), body


def _pct(v, se=None) -> str:
    return f"{100 * v:.1f}" + (f" ± {100 * se:.1f}" if se is not None else "")


def test_card_of_the_recorded_run_and_its_evaluation(run, eval_dir, tmp_path, capsys, fake_hub):
    before = _snapshot(run)
    staging = tmp_path / "stage"
    code, out, err = _push(capsys, run, "me/tiny-trlvr", "--eval", eval_dir, "--staging", staging, "--dry-run")
    assert code == 0, err
    assert fake_hub.calls == []  # a dry run builds no client at all
    card = (staging / "README.md").read_text()
    meta, body = _card_parts(card)
    assert meta["library_name"] == "transformers" and {"tandem-rlvr", "grpo", "trlvr"} <= set(meta["tags"])
    assert "base_model" not in meta  # world:senior is not a Hub model
    assert "| arm | `trlvr`" in body and "| junior (frozen) | world:junior |" in body
    assert "schedule `word`, P(senior) p = 0.5" in body and "| steps x prompts x group | 2 x 2 x 4 |" in body
    config_text = (run / "config.yaml").read_text()
    assert "```yaml\n" + config_text.rstrip() + "\n```" in body  # the full resolved config, verbatim
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    kl = [f"{r['kl/senior_junior']:.4g}" for r in (rows[0], rows[-1])]
    assert f"| `kl/senior_junior` | {kl[0]} | {kl[1]} |" in body and "2 logged steps (last: step 2)" in body
    obj = json.loads((eval_dir / "eval.json").read_text())
    mine, other = obj["seniors"]["trlvr"], obj["seniors"]["small"]
    val, macro = mine["per_benchmark"]["world/val"], mine["macro"]
    assert (f"| world/val | 3 | {_pct(val['solo_pass@1'], val['solo_pass@1_se'])} | "
            f"{_pct(val['handoff_pass@1'], val['handoff_pass@1_se'])} | {val['communication_tax']:+.1f} ± "
            f"{val['communication_tax_se']:.1f} | {val['junior_ce']:.3f} |") in body
    assert (f"| **macro** | 6 | {_pct(macro['solo_pass@1'], macro['solo_pass@1_se'])} | "
            f"{_pct(macro['handoff_pass@1'], macro['handoff_pass@1_se'])} |") in body
    assert f"{macro['junior_bpb']:.3f}" in body and f"{macro['kl_senior_junior_exact']:.4f}" in body
    assert f"{other['macro']['junior_ce']:.3f}" not in body  # the other senior's numbers are not this one's
    assert "named `trlvr` there" in body and "### With junior `junior`" in body
    assert "arXiv:2606.28166" in body and "arXiv:2510.13551" in body
    assert 'from_pretrained("me/tiny-trlvr")' in body
    assert "model.safetensors" in out and "dry run: nothing uploaded" in out and "left out: COMPLETE, checksums.json" in out
    assert _snapshot(run) == before  # the run directory is never written


def test_card_names_a_hub_base_model_and_a_self_paired_junior(run, tmp_path, capsys):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"].update(senior="Qwen/Qwen3-4B-Instruct-2507", junior=None, self_paired=True)
    cfg["algo"]["arm"] = "kl_reg"
    cfg["algo"]["kl_beta"] = 0.05
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    code, _, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s", "--dry-run")
    assert code == 0, err
    meta, body = _card_parts((tmp_path / "s" / "README.md").read_text())
    assert meta["base_model"] == "Qwen/Qwen3-4B-Instruct-2507" and "kl_reg" in meta["tags"]
    assert "frozen copy of the senior's starting weights (Qwen/Qwen3-4B-Instruct-2507; self-paired)" in body
    assert "| rollouts | solo (no handoffs); KL weight kl_beta = 0.05 |" in body and "## Evaluation" not in body


def test_push_uploads_the_weights_and_the_card_only(run, eval_dir, tmp_path, capsys, fake_hub, monkeypatch):
    from tandem_rlvr import integrity

    final = run / "final"
    for name in ("optimizer.pt", "pytorch_model.bin", "train_state.pt", "rng_state.pth", "optimizer.safetensors"):
        (final / name).write_bytes(b"not for the Hub")
    (final / "trainer_state.json").write_text("{}")
    (final / "adapter").mkdir()  # a LoRA run's final/ also holds its adapter
    (final / "adapter" / "adapter_model.safetensors").write_bytes(b"adapter weights")
    (final / "adapter" / "adapter_config.json").write_text("{}")
    (final / integrity.SUMS).unlink()
    integrity.write_checksums(final)  # they belong to the folder now, so it verifies
    monkeypatch.setenv("HF_TOKEN", SECRET)
    code, out, err = _push(capsys, run, "me/tiny-trlvr", "--eval", eval_dir, "--staging", tmp_path / "stage",
                           "--private", "--revision", "dev")
    assert code == 0, err
    kinds = [k for k, _ in fake_hub.calls]
    assert kinds == ["init", "create_repo", "repo_info", "create_branch", "upload_folder"]
    calls = dict(fake_hub.calls)
    assert calls["init"]["token"] == SECRET
    assert calls["create_repo"] == {"repo_id": "me/tiny-trlvr", "private": True, "exist_ok": True, "repo_type": "model"}
    assert calls["create_branch"]["branch"] == "dev" and calls["create_branch"]["exist_ok"] is True
    up = calls["upload_folder"]
    assert up["repo_id"] == "me/tiny-trlvr" and up["revision"] == "dev"
    # weights an earlier push left (a single file beside a new sharded index, .bin) go in the same commit
    assert {"*.safetensors", "*.safetensors.index.json", "*.bin"} <= set(up["delete_patterns"])
    expected = {"README.md", "model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "adapter/adapter_model.safetensors", "adapter/adapter_config.json"}
    assert expected <= set(up["files"]), up["files"]
    assert set(up["files"]) - expected <= {"chat_template.jinja", "special_tokens_map.json"}, up["files"]
    assert up["files"]["model.safetensors"] == _sha(final / "model.safetensors")  # the verified bytes
    assert up["card"] == (tmp_path / "stage" / "README.md").read_text() and "## Evaluation" in up["card"]
    assert "pushed me/tiny-trlvr (branch dev): https://huggingface.co/me/tiny-trlvr/commit/abc" in out
    assert SECRET not in out + err


def test_push_public_main_passes_no_private_flag_and_no_branch(run, tmp_path, capsys, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    code, _, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s", "--folder", "best")
    assert code == 0, err
    calls = dict(fake_hub.calls)
    assert "create_branch" not in calls and calls["create_repo"]["private"] is None
    assert calls["upload_folder"]["revision"] is None
    assert calls["upload_folder"]["files"]["model.safetensors"] == _sha(run / "best" / "model.safetensors")
    assert "`best/` (step 1: best val/pass@1 = 0.125 in validation)" in calls["upload_folder"]["card"]


@pytest.mark.parametrize("damage", ["altered", "truncated", "unlisted", "missing"])
def test_a_folder_whose_checksums_fail_is_refused(run, tmp_path, capsys, fake_hub, monkeypatch, damage):
    weights = run / "final" / "model.safetensors"
    if damage == "altered":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-8])
    elif damage == "unlisted":
        (run / "final" / "extra.safetensors").write_bytes(b"\0" * 8)
    else:
        (run / "final" / "config.json").unlink()
    monkeypatch.setenv("HF_TOKEN", SECRET)
    code, out, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s")
    assert code == 2 and err.count("\n") == 1, err
    assert "does not verify" in err and "not pushed" in err
    assert fake_hub.calls == []
    assert not (tmp_path / "s").exists() and "pushed" not in out


def test_a_folder_without_checksums_needs_trust_unverified(run, tmp_path, capsys, fake_hub):
    (run / "final" / "checksums.json").unlink()
    code, _, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s", "--dry-run")
    assert code == 2 and "no checksums.json" in err and "--trust-unverified" in err
    code, out, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s", "--dry-run", "--trust-unverified")
    assert code == 0, err
    assert "NOT verified" in out and "without checksums" in (tmp_path / "s" / "README.md").read_text()


def test_no_token_no_push_and_a_hub_error_is_one_line_without_the_token(run, tmp_path, capsys, fake_hub, monkeypatch):
    from types import SimpleNamespace

    from huggingface_hub.errors import HfHubHTTPError

    code, _, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s")
    assert code == 2 and "HF_TOKEN" in err and fake_hub.calls == []
    monkeypatch.setenv("HF_TOKEN", SECRET)
    response = SimpleNamespace(status_code=401, headers={}, request=None)  # what the error reads of a response
    FakeApi.fail = HfHubHTTPError(f"401 Client Error: Unauthorized\nInvalid credentials in Authorization header {SECRET}",
                                  response=response)
    code, out, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s")
    assert code == 2 and err.count("\n") == 1 and "401 Client Error" in err and "me/x" in err
    assert SECRET not in out + err


def test_eval_senior_choice(run, eval_dir, tmp_path, capsys, caplog):
    obj = json.loads((eval_dir / "eval.json").read_text())
    obj["settings"]["seniors"]["trlvr"] = "elsewhere/final"
    (eval_dir / "eval.json").write_text(json.dumps(obj))
    code, _, err = _push(capsys, run, "me/x", "--eval", eval_dir, "--staging", tmp_path / "s", "--dry-run")
    assert code == 2 and "trlvr, small" in err and "--eval-senior" in err  # two seniors, neither this folder
    code, _, err = _push(capsys, run, "me/x", "--eval", eval_dir, "--eval-senior", "small", "--staging",
                         tmp_path / "s", "--dry-run")
    assert code == 0, err
    body = (tmp_path / "s" / "README.md").read_text()
    assert f"{obj['seniors']['small']['macro']['junior_ce']:.3f}" in body
    code, _, err = _push(capsys, run, "me/x", "--eval", eval_dir, "--eval-senior", "nobody", "--dry-run",
                         "--staging", tmp_path / "s")
    assert code == 2 and "'nobody' is not in" in err
    code, _, err = _push(capsys, run, "me/x", "--eval", tmp_path, "--dry-run", "--staging", tmp_path / "s")
    assert code == 2 and "no eval.json" in err
    del obj["seniors"]["small"]  # the only senior, evaluated from another path: taken, with a warning
    (eval_dir / "eval.json").write_text(json.dumps(obj))
    code, _, err = _push(capsys, run, "me/x", "--eval", eval_dir, "--dry-run", "--staging", tmp_path / "s")
    assert code == 0, err
    assert "from `elsewhere/final`" in (tmp_path / "s" / "README.md").read_text()
    assert any("not from" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


def test_staging_is_never_the_run_nor_a_folder_it_did_not_make(run, tmp_path, capsys):
    before = _snapshot(run)
    code, _, err = _push(capsys, run, "me/x", "--staging", run / "hub", "--dry-run")
    assert code == 2 and "inside the run directory" in err and not (run / "hub").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, _, err = _push(capsys, run, "me/x", "--staging", mine, "--dry-run")
    assert code == 2 and "was not made by" in err and (mine / "notes.txt").read_text() == "keep me"
    for _ in range(2):  # its own staging folder is replaced on a rerun
        code, _, err = _push(capsys, run, "me/x", "--staging", tmp_path / "s", "--dry-run")
        assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run", "s"]
    assert _snapshot(run) == before


def test_bad_repo_id_and_missing_folders(run, tmp_path, capsys):
    code, _, err = _push(capsys, run, "not a repo id", "--dry-run")
    assert code == 2 and "REPO_ID 'not a repo id'" in err
    shutil.rmtree(run / "best")
    code, _, err = _push(capsys, run, "me/x", "--folder", "best", "--dry-run", "--staging", tmp_path / "s")
    assert code == 2 and "best does not exist" in err and "val.every" in err
    code, _, err = _push(capsys, tmp_path, "me/x", "--dry-run", "--staging", tmp_path / "s")
    assert code == 2 and "not a run directory" in err


def test_private_push_to_an_existing_public_repository_is_refused(run, tmp_path, capsys, fake_hub, monkeypatch):
    """create_repo(private=True, exist_ok=True) leaves an existing public repository public: --private checks the
    repository's visibility and uploads nothing to a public one."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    fake_hub.public_repos = {"me/open"}
    code, _, err = _push(capsys, run, "me/open", "--staging", tmp_path / "s", "--private")
    assert code == 2 and "already exists and is public" in err and "nothing was uploaded" in err
    assert "upload_folder" not in [k for k, _ in fake_hub.calls]
    code, _, err = _push(capsys, run, "me/open", "--staging", tmp_path / "s")  # without --private: as asked
    assert code == 0, err
