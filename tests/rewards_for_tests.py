"""A reward with spread on random tiny models, importable as tests.rewards_for_tests:length_reward
(``data.reward: rewards_for_tests:length_reward`` with tests/ on PYTHONPATH)."""


def length_reward(completion: str, gold: str, **kwargs) -> float:
    """1.0 when the completion's length is a multiple of 3 (random models: about a third of the time)."""
    return float(len(completion) % 3 == 0)
