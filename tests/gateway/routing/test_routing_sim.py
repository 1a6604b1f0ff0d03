"""The routing simulation on tiny traces: its bookkeeping, not its timings or who wins."""

import dataclasses

import pytest
from bench.routing_policies import POLICIES, make_policy
from bench.routing_scenario import POLICY_YAML, SCENARIO, Incident, make_trace
from bench.routing_sim import TYPICAL_OUTPUT, Simulation, simulate

from gateway.inflight import INTERVAL_S
from gateway.policy import parse_policy


@pytest.fixture(scope="module")
def tiny():
    return simulate(seed=3, hours=0.5, peak_rps=2.0)


def test_simulation_accounts_for_every_request_under_every_policy(tiny):
    assert tiny["requests"] > 100
    assert set(tiny["policies"]) == set(POLICIES)
    for name, f in tiny["policies"].items():
        assert f["requests"] == tiny["requests"], name
        assert f["served"] + f["failed"] == f["requests"], name
        assert sum(f["by_deployment"].values()) == f["served"], name
        assert 0 <= f["slo_met"] <= f["served"], name
        assert f["attempts"] >= f["served"], name
        assert all(0.0 <= a <= 1.0 for a in f["attainment_by_class"].values()), name


def test_simulation_costs_are_non_negative_and_add_up(tiny):
    for name, f in tiny["policies"].items():
        assert f["api_cost_usd"] >= 0 and f["engine_cost_usd"] >= 0, name
        assert f["cost_usd"] == pytest.approx(f["api_cost_usd"] + f["engine_cost_usd"]), name
    assert tiny["policies"]["always-fastest"]["by_deployment"] == {"premium/llama": tiny["requests"]}
    assert tiny["policies"]["always-fastest"]["engine_cost_usd"] == 0.0


def test_simulation_is_deterministic_for_a_seed(tiny):
    again = simulate(seed=3, hours=0.5, peak_rps=2.0)

    def strip(run):
        return {n: {k: v for k, v in f.items() if k != "runtime_s"} for n, f in run["policies"].items()}

    assert strip(again) == strip(tiny)
    assert make_trace(4, 0.5, 2.0, 4).arrival.tolist() != make_trace(3, 0.5, 2.0, 4).arrival.tolist()


@pytest.mark.parametrize("name", [*POLICIES, "oracle-latency", "crossway-x2"])
def test_simulation_counts_requests_failed_when_every_deployment_fails(name):
    broken = tuple(dataclasses.replace(d, incidents=(Incident(0.0, 24.0, error_rate=1.0),)) for d in SCENARIO)
    trace = make_trace(5, 0.1, 1.0, len(broken))
    sim = Simulation(trace, parse_policy(POLICY_YAML, {}), broken)
    policy = make_policy(name, sim, 5, TYPICAL_OUTPUT)
    tally = sim.run(policy)
    assert tally.failed == trace.arrival.size
    assert tally.served == {} and tally.met == {} and tally.api_cost == 0.0
    assert sim.in_flight == dict.fromkeys(sim.deployments, 0)
    assert getattr(policy, "_judged", {}) == {}  # Crossway forgets a request that failed for good


def test_one_replica_routes_exactly_as_the_single_router(tiny):
    one = simulate(seed=3, hours=0.5, peak_rps=2.0, policies=("crossway-x1",))["policies"]["crossway-x1"]
    single = tiny["policies"]["crossway"]
    assert {k: v for k, v in one.items() if k not in ("runtime_s", "vs_oracle")} == {
        k: v for k, v in single.items() if k not in ("runtime_s", "vs_oracle")
    }


def test_replicas_account_for_every_request_and_each_learns_from_its_own():
    trace = make_trace(3, 0.5, 2.0, len(SCENARIO))
    sim = Simulation(trace, parse_policy(POLICY_YAML, {}))
    policy = make_policy("crossway-x3", sim, 3, TYPICAL_OUTPUT)
    tally = sim.run(policy)
    assert sum(tally.served.values()) + tally.failed == trace.arrival.size
    routers = policy.routers  # type: ignore[attr-defined]
    assert len(routers) == 3
    # each replica learned from about a third of the outcomes, and none is left with requests in flight
    seen = [sum(r.stats[k].outcomes for k in sim.deployments) for r in routers]
    assert sum(seen) == tally.attempts  # a first byte or a failure per attempt
    assert all(0.25 * sum(seen) < n < 0.42 * sum(seen) for n in seen)
    assert all(r.stats[k].in_flight == 0 for r in routers for k in sim.deployments)


def test_the_failure_blind_oracle_tries_attempts_that_fail_where_the_clairvoyant_one_never_does():
    # the engine and budget are down, and mid fails 4 attempts in 10: under the failure-blind oracle's
    # bar of a half, so, the cheapest left, it is tried first
    rates = {"local/llama": 1.0, "budget/llama": 1.0, "mid/llama": 0.4}
    flaky = tuple(
        dataclasses.replace(d, incidents=(Incident(0.0, 24.0, error_rate=rates[d.key]),)) if d.key in rates else d
        for d in SCENARIO
    )
    trace = make_trace(6, 0.5, 3.0, len(flaky))
    tallies = {}
    for name in ("oracle", "oracle-latency"):
        sim = Simulation(trace, parse_policy(POLICY_YAML, {}), flaky)
        tallies[name] = sim.run(make_policy(name, sim, 6, TYPICAL_OUTPUT))
    clairvoyant, blind = tallies["oracle"], tallies["oracle-latency"]
    assert clairvoyant.attempts == sum(clairvoyant.served.values()) == trace.arrival.size
    assert blind.attempts > sum(blind.served.values()) == trace.arrival.size  # failed over, none lost
    assert set(blind.by_deployment) == set(clairvoyant.by_deployment) == {"mid/llama", "premium/llama"}


def test_shared_replicas_learn_each_others_in_flight_counts_once_an_interval():
    trace = make_trace(3, 0.5, 2.0, len(SCENARIO))
    sim = Simulation(trace, parse_policy(POLICY_YAML, {}))
    policy = make_policy("crossway-x3-shared", sim, 3, TYPICAL_OUTPUT)
    tally = sim.run(policy)
    assert sum(tally.served.values()) + tally.failed == trace.arrival.size
    routers = policy.routers  # type: ignore[attr-defined]
    assert all(r.stats["mid/llama"].in_flight == 0 for r in routers)
    for router, n in zip(routers, (1, 2, 3), strict=True):
        router.stats["mid/llama"].in_flight = n
    sim.now = policy._synced + INTERVAL_S / 2  # type: ignore[attr-defined]
    policy._sync(sim)  # type: ignore[attr-defined]  # within an interval of the last sync: nothing read
    assert [r.stats["mid/llama"].elsewhere for r in routers] == [0, 0, 0]
    sim.now += INTERVAL_S
    policy._sync(sim)  # type: ignore[attr-defined]
    assert [r.stats["mid/llama"].elsewhere for r in routers] == [5, 4, 3]
