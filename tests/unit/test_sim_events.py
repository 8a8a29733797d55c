"""The event core: time order, FIFO among equal times, the horizon and the stop flag."""

from echo2.sim.events import EventLoop


def test_events_run_in_time_order_and_ties_in_scheduling_order():
    loop, seen = EventLoop(), []
    for label, at in [("c", 3.0), ("a1", 1.0), ("b", 2.0), ("a2", 1.0), ("a3", 1.0)]:
        loop.at(at, seen.append, label)
    loop.run(horizon_s=10)
    assert seen == ["a1", "a2", "a3", "b", "c"]
    assert loop.now_s == 3.0 and loop.processed == 5


def test_handlers_schedule_more_events_and_never_in_the_past():
    loop, seen = EventLoop(), []

    def tick(n):
        seen.append((loop.now_s, n))
        if n < 3:
            loop.after(0.5, tick, n + 1)
            loop.at(-1.0, seen.append, ("past", n))  # clamped to now: runs after the current event

    loop.at(1.0, tick, 0)
    loop.run(horizon_s=10)
    assert [t for t, _ in seen if t != "past"] == [1.0, 1.5, 2.0, 2.5]
    assert seen[1] == ("past", 0)


def test_stop_flag_and_horizon():
    loop = EventLoop()
    loop.at(1.0, setattr, loop, "stopped", True)
    loop.at(2.0, print, "never")
    assert loop.run(horizon_s=10) is True and loop.now_s == 1.0

    late = EventLoop()
    late.at(5.0, print, "beyond")
    assert late.run(horizon_s=4.0) is False and late.now_s == 0.0
