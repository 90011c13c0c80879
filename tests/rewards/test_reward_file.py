"""data.reward as ``path/to/file.py:function``: imported by path (no package, no sys.path), a relative path
read from the config file's directory (from the current directory when typed as an override), and every
failure one line naming data.reward."""

from __future__ import annotations

import sys

import pytest

from tandem_rlvr.config import load_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.rewards import import_reward

REWARD = '''
def exact(completion, gold, **kwargs):
    return 1.0 if completion.strip().endswith(str(gold)) else 0.0


def trl_style(prompts, completions, completion_ids, answer, **kwargs):
    return [1.0 if c.strip().endswith(a) else 0.0 for c, a in zip(completions, answer)]

NOT_A_FUNCTION = 3
'''


def _config(directory, reward: str):
    directory.mkdir(parents=True, exist_ok=True)
    y = directory / "config.yaml"
    y.write_text(f"model: {{senior: s, self_paired: true}}\ntrain: {{out_dir: {directory / 'run'}}}\n"
                 f"data: {{reward: '{reward}'}}\n", encoding="utf-8")
    return y


def test_reward_file_beside_the_config_is_found_from_another_directory(tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "reward.py").write_text(REWARD, encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the run starts from another directory than the config's
    cfg = load_config(_config(exp, "reward.py:exact"))
    assert cfg.data.reward == f"{exp / 'reward.py'}:exact"  # absolute in the saved config.yaml too
    fn = import_reward(cfg.data.reward)
    assert (fn("the answer is 7", "7"), fn("the answer is 8", "7")) == (1.0, 0.0)
    trl = import_reward(f"{exp / 'reward.py'}:trl_style")  # TRL's signature, adapted as for modules
    assert (trl("so 7", "7"), trl("so 8", "7")) == (1.0, 0.0)
    assert str(exp) not in sys.path  # imported by path: its folder is not put on sys.path


def test_override_path_is_read_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(REWARD, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(_config(tmp_path / "exp", "math"), ["data.reward=mine.py:exact"])
    assert import_reward(cfg.data.reward)("x 3", "3") == 1.0
    # saved absolute: the run's config.yaml and a resume from another directory read the same file
    assert cfg.data.reward == f"{tmp_path / 'mine.py'}:exact"


def test_a_module_reward_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    """package.module:function whose module raises (not only ImportError) is the same one-line error."""
    (tmp_path / "badmod.py").write_text("x = undefined_name\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TandemError, match=r"^data\.reward 'badmod:f' cannot be imported: NameError: "):
        import_reward("badmod:f")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("missing.py:exact", r"^data\.reward '.*missing\.py:exact': no such file '.*missing\.py'$"),
        ("reward.py:nope", r"^data\.reward '.*reward\.py:nope': .*reward\.py has no function 'nope' \(it defines: exact, "
                           r"trl_style\)$"),
        ("reward.py:", r"has no function ''"),
        ("broken.py:f", r"^data\.reward '.*broken\.py:f': importing '.*broken\.py' failed: SyntaxError: "),
        ("raises.py:f", r"^data\.reward '.*raises\.py:f': importing '.*raises\.py' failed: RuntimeError: boom$"),
        ("reward.py:NOT_A_FUNCTION", r"^data\.reward '.*reward\.py:NOT_A_FUNCTION' is not callable$"),
    ],
)
def test_reward_file_errors_are_one_line_naming_data_reward(tmp_path, spec, match):
    (tmp_path / "reward.py").write_text(REWARD, encoding="utf-8")
    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    cfg = load_config(_config(tmp_path, spec))
    with pytest.raises(TandemError, match=match) as e:
        import_reward(cfg.data.reward)
    assert "\n" not in str(e.value)


def test_module_rewards_still_import(tmp_path):
    assert import_reward("math") is None
    with pytest.raises(TandemError, match=r"^data\.reward 'no_such_module_xyz:f' cannot be imported"):
        import_reward("no_such_module_xyz:f")
    with pytest.raises(TandemError, match=r"^data\.reward 'json:nope': json has no function 'nope'"):
        import_reward("json:nope")
    assert import_reward("json:dumps") is __import__("json").dumps
