"""A reward with spread on random tiny models, importable as helpers.rewards_for_tests:length_reward
(``data.reward: helpers.rewards_for_tests:length_reward`` with tests/ on PYTHONPATH)."""


def length_reward(completion: str, gold: str, **kwargs) -> float:
    """1.0 when the completion's length is a multiple of 3 (random models: about a third of the time)."""
    return float(len(completion) % 3 == 0)


_calls = [0]


def stall_in_step_two(completion: str, gold: str, **kwargs) -> float:
    """length_reward for the first 16 responses (step 1 of a 4-prompt x 4-rollout run), then hangs: a stuck verifier."""
    import time

    _calls[0] += 1
    if _calls[0] > 16:
        time.sleep(3600)
    return length_reward(completion, gold)


def paced_length_reward(completion: str, gold: str, **kwargs) -> float:
    """length_reward, 50 ms per call: a run whose steps last long enough for a signal to land mid-run."""
    import time

    time.sleep(0.05)
    return length_reward(completion, gold)
