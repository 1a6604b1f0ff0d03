import pytest

from gateway.breaker import Breaker, Breakers


class Clock:
    """A hand-moved clock: tests step time instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def opened(failures=3, cooldown=10.0):
    clock = Clock()
    breakers = Breakers(failures, cooldown, clock=clock)
    for _ in range(failures):
        assert breakers["d"].acquire(clock())
        breakers["d"].failure(clock())
    return breakers, clock


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_breaker_opens_after_threshold_consecutive_failures(threshold):
    breaker = Breaker(threshold, 10.0)
    for _ in range(threshold - 1):
        breaker.failure(0.0)
        assert breaker.state(0.0) == "closed"
    breaker.failure(0.0)
    assert breaker.state(0.0) == "open"
    assert not breaker.acquire(0.0)


def test_breaker_success_resets_the_failure_count():
    breaker = Breaker(3, 10.0)
    breaker.failure(0.0)
    breaker.failure(0.0)
    breaker.success()
    breaker.failure(0.0)
    breaker.failure(0.0)
    assert breaker.state(0.0) == "closed"
    breaker.failure(0.0)
    assert breaker.state(0.0) == "open"


def test_breaker_stays_open_until_the_cooldown_ends():
    breakers, clock = opened(cooldown=10.0)
    clock.now += 9.999
    assert breakers.state("d") == "open"
    assert not breakers["d"].acquire(clock())
    clock.now += 0.001
    assert breakers.state("d") == "half_open"


def test_half_open_breaker_admits_exactly_one_probe():
    breakers, clock = opened()
    clock.now += 10.0
    breaker = breakers["d"]
    assert breaker.acquire(clock())
    assert breakers.state("d") == "open"
    assert [breaker.acquire(clock()) for _ in range(5)] == [False] * 5
    clock.now += 100.0  # a probe in flight holds the breaker however long it takes
    assert not breaker.acquire(clock())


def test_half_open_breaker_closes_when_the_probe_succeeds():
    breakers, clock = opened()
    clock.now += 10.0
    assert breakers["d"].acquire(clock())
    breakers["d"].success()
    assert breakers.state("d") == "closed"
    assert all(breakers["d"].acquire(clock()) for _ in range(3))


def test_breaker_success_says_whether_it_ended_an_outage():
    breakers, clock = opened()
    assert not Breaker(3, 10.0).success()  # closed all along
    clock.now += 10.0
    assert breakers["d"].acquire(clock())
    assert breakers["d"].success()  # the probe: the deployment is back
    assert not breakers["d"].success()


def test_half_open_breaker_reopens_for_a_full_cooldown_when_the_probe_fails():
    breakers, clock = opened(failures=3, cooldown=10.0)
    clock.now += 10.0
    assert breakers["d"].acquire(clock())
    breakers["d"].failure(clock())
    assert breakers.state("d") == "open"
    clock.now += 9.0
    assert breakers.state("d") == "open"
    clock.now += 1.0
    assert breakers.state("d") == "half_open"
    assert breakers["d"].acquire(clock())


def test_released_probe_lets_the_next_caller_probe():
    breakers, clock = opened()
    clock.now += 10.0
    assert breakers["d"].acquire(clock())
    breakers["d"].release()
    assert breakers.state("d") == "half_open"
    assert breakers["d"].acquire(clock())
    assert not breakers["d"].acquire(clock())


def test_breakers_are_closed_on_first_mention_and_independent():
    breakers, _ = opened()
    assert breakers.state("other") == "closed"
    assert breakers.state("d") == "open"
    assert breakers["other"].acquire(0.0)


def test_configure_applies_new_thresholds_and_keeps_state():
    clock = Clock()
    breakers = Breakers(5, 30.0, clock=clock)
    breakers["d"].failure(clock())
    breakers.configure(2, 5.0)
    assert breakers.state("d") == "closed"
    breakers["d"].failure(clock())
    assert breakers.state("d") == "open"
    clock.now += 5.0
    assert breakers.state("d") == "half_open"
    assert breakers["new"].threshold == 2 and breakers["new"].cooldown_s == 5.0
