"""Where torch's contract for a backend is subtle, the braid backend keeps it as Gloo does, each
case checked against a reference the test computes itself and, where Gloo does it, against Gloo's
own result in the same run: point-to-point operations larger than braid's FIFOs completing in any
order of posting, receives matched to messages by tag, all_gather_coalesced's [rank][input]
layout, all_reduce_coalesced of a list that holds one tensor twice, reduce_scatter with uneven
inputs, sparse all_reduce and DDP with sparse gradients, a receive from any source."""

import datetime
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

POISON = -77.0
BIG = 4 << 20  # 4M floats each way: 16 MiB, far more than braid's FIFOs hold


def payload(rank, n, salt=0):
    return torch.arange(n, dtype=torch.float32) * (rank + 2) + salt


def post(kind, tensor, peer):
    return (dist.isend if kind == "send" else dist.irecv)(tensor, peer)


def exchange_in_order(rank, size, order):
    """Rank 0 and rank 1 each send the other BIG floats and receive BIG floats, posting the two
    as `order` says for that rank: "send" or "recv" first, or "batch" (one batch_isend_irecv)."""
    if rank > 1:
        return
    peer = 1 - rank
    mine, got = payload(rank, BIG), torch.full((BIG,), POISON)
    first = order[rank]
    if first == "batch":
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                        dist.P2POp(dist.irecv, got, peer)])
    else:
        second = "recv" if first == "send" else "send"
        works = [post(first, mine if first == "send" else got, peer),
                 post(second, mine if second == "send" else got, peer)]
    for work in works:
        work.wait()
    assert torch.equal(got, payload(peer, BIG)), f"rank {rank} ({order}): wrong data received"


@pytest.mark.parametrize("order", [("send", "send"), ("recv", "recv"), ("send", "recv"),
                                   ("batch", "send"), ("recv", "batch")])
def test_lone_isend_and_irecv_larger_than_the_fifos_complete_in_any_order(run_ranks, order):
    run_ranks(2, exchange_in_order, order, timeout_s=20)


def ring_receive_first(rank, size):
    """Every rank posts its receive from the previous rank, then its send to the next."""
    prev, nxt = (rank - 1) % size, (rank + 1) % size
    got = torch.full((BIG // 4,), POISON)
    works = [dist.irecv(got, prev), dist.isend(payload(rank, BIG // 4), nxt)]
    for work in works:
        work.wait()
    assert torch.equal(got, payload(prev, BIG // 4)), f"rank {rank}: wrong data from {prev}"


def ring_with_a_late_sender(rank, size):
    """ring_receive_first, but rank 1 posts its send a while after its receive ended, when rank 0
    (whose process holds the TCPStore's server) has nothing left to do but leave."""
    prev, nxt = (rank - 1) % size, (rank + 1) % size
    got = torch.full((BIG // 4,), POISON)
    receive = dist.irecv(got, prev)
    if rank == 1:
        receive.wait()
        time.sleep(2)
    dist.isend(payload(rank, BIG // 4), nxt).wait()
    receive.wait()
    assert torch.equal(got, payload(prev, BIG // 4)), f"rank {rank}: wrong data from {prev}"


def test_first_messages_meet_through_a_tcp_store(run_ranks):
    """torchrun's store (a TCPStore holds its client while a get waits): the channels' first
    messages, receives posted first, on 2 ranks and round a ring of 3."""
    run_ranks(2, exchange_in_order, ("recv", "recv"), timeout_s=20, store="tcp")
    run_ranks(3, ring_receive_first, timeout_s=20, store="tcp")


def test_the_stores_host_stays_while_other_ranks_channels_meet(run_ranks):
    """A TCPStore made by init_process_group lives in rank 0's process, and channels meet through
    it: rank 0, done, must not leave while ranks 1 and 2 still have to meet (the sender comes late)
    (CI once saw rank 2's channel from rank 1 fail so, at random)."""
    run_ranks(3, ring_with_a_late_sender, timeout_s=20, store="tcp")


MEETINGS_KEY = "braid_torch/p2p/meetings_in_flight"  # the backend's count, in the job's store


def meetings_in_flight():
    store = dist.distributed_c10d._get_default_store()
    return store._underlying_non_prefix_store.add(MEETINGS_KEY, 0)


def channels_met_every_way(rank, size):
    """On 3 ranks: a ring, a batch between ranks 0 and 1, a receive from any source at rank 0
    (rank 1's channel to it not yet met), a send issued by a receive's callback; then, every
    operation ended, the job's count of channels meeting through the store comes back to 0 (a
    count left above 0 would make every rank's destroy_process_group wait out the timeout)."""
    n = 1024
    prev, nxt = (rank - 1) % size, (rank + 1) % size
    got = torch.full((n,), POISON)
    works = [dist.irecv(got, prev), dist.isend(payload(rank, n), nxt)]
    if rank < 2:
        batch_got = torch.full((n,), POISON)
        works += dist.batch_isend_irecv([dist.P2POp(dist.isend, payload(rank, n, 1), 1 - rank),
                                         dist.P2POp(dist.irecv, batch_got, 1 - rank)])
    for work in works:
        work.wait()
    assert torch.equal(got, payload(prev, n)), f"rank {rank}: ring"
    if rank < 2:
        assert torch.equal(batch_got, payload(1 - rank, n, 1)), f"rank {rank}: batch"
    any_got, relayed = torch.full((n,), POISON), torch.full((n,), POISON)
    if rank == 0:
        work = dist.irecv(any_got)
        work.wait()
        assert work._source_rank() == 2 and torch.equal(any_got, payload(2, n, 2)), "any source"
        dist.send(payload(0, n, 3), 1)
    elif rank == 1:
        sent = []  # the callback's send, issued on the receive channel's thread
        dist.irecv(relayed, 0).get_future().then(
            lambda _: sent.append(dist.isend(relayed * 2, 2))).wait()
        sent[0].wait()
    else:
        dist.send(payload(2, n, 2), 0)
        dist.recv(relayed, 1)
        assert torch.equal(relayed, payload(0, n, 3) * 2), "the callback's send"
    dist.barrier()
    deadline = time.monotonic() + 20  # any-source probes end a moment after their receive
    while meetings_in_flight() != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert meetings_in_flight() == 0, f"rank {rank}: {meetings_in_flight()} meetings left counted"


def test_every_channel_meeting_counted_is_given_back(run_ranks):
    run_ranks(3, channels_met_every_way, timeout_s=30)


def fails_then_the_group_goes_on(rank, size, failing, name, failure):
    """Rank `failing` runs failure() while the others wait for it (through the store), then every
    rank meets in an all_reduce: one rank's failed operation leaves the group usable."""
    store = dist.distributed_c10d._get_default_store()
    if rank == failing:
        failure()
        store.set(name + "/failed", "1")
    else:
        store.wait([name + "/failed"], datetime.timedelta(seconds=60))
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(size)))


def unmatched_receive(rank, size):
    """Rank 0 waits for a message rank 1 never sends: braid's error within the timeout, naming
    who waited for whom (it said "rank 1 waited for rank 1": a channel's own rank numbers), a
    DistBackendError saying "Timed out" as torch's backends do, and the group goes on."""
    def failure():
        work = dist.irecv(torch.zeros(4), 1)
        with pytest.raises(dist.DistBackendError,
                           match="braid backend: Timed out after [0-9]+ ms: rank 0 waited for "
                                 "rank 1 to post its first send to it"):
            work.wait()

    fails_then_the_group_goes_on(rank, size, 0, "unmatched_receive", failure)


def test_a_receive_whose_send_never_comes_fails_within_the_timeout(run_ranks):
    run_ranks(2, unmatched_receive, timeout_s=5)


def receive_in_callback(rank, size):
    """A receive issued by the callback of a completing receive from the same peer (which runs
    on that peer's channel) and waited for there."""
    first, second = torch.full((3,), POISON), torch.full((3,), POISON)
    if rank == 0:
        dist.send(torch.full((3,), 1.0), 1)
        dist.send(torch.full((3,), 2.0), 1)
    else:
        def then(_):
            dist.recv(second, 0)
            return second

        chained = dist.irecv(first, 0).get_future().then(then)
        chained.wait()
        assert first.tolist() == [1.0] * 3 and second.tolist() == [2.0] * 3, (first, second)


def test_a_callback_may_receive_from_the_same_peer(run_ranks):
    run_ranks(2, receive_in_callback, timeout_s=20)


def several_messages(rank, size):
    """Every rank sends three messages of different sizes to every other rank before it
    receives any: each pair's messages arrive in the order sent, whatever the posting order."""
    sizes = [BIG // 2, 3, 1000]
    works, recvs = [], {}
    for peer in range(size):
        if peer != rank:
            works += [dist.isend(payload(rank, n, salt=i), peer) for i, n in enumerate(sizes)]
    for peer in reversed(range(size)):
        if peer != rank:
            recvs[peer] = [torch.full((n,), POISON) for n in sizes]
            works += [dist.irecv(t, peer) for t in recvs[peer]]
    for work in works:
        work.wait()
    for peer, got in recvs.items():
        for i, n in enumerate(sizes):
            assert torch.equal(got[i], payload(peer, n, salt=i)), f"message {i} from {peer}"
    # A blocking send and receive afterwards still meet.
    t = torch.full((5,), float(rank))
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        assert torch.equal(t, torch.zeros(5)), "blocking recv after the batch"


@pytest.mark.parametrize("size", [2, 3])
def test_messages_between_a_pair_arrive_in_the_order_sent(run_ranks, size):
    run_ranks(size, several_messages, timeout_s=30)


def sends_of_types_braid_does_not_reduce(rank, size):
    """Every rank sends its successor a tensor of each type braid has no datatype for (torch's
    int16, uint16, uint32, uint64): they travel as bytes, as Gloo sends them. Values past each
    narrower type's range check every byte."""
    to, frm = (rank + 1) % size, (rank - 1) % size
    for dtype in (torch.int16, torch.uint16, torch.uint32, torch.uint64):
        mine = (torch.arange(1001, dtype=torch.int64) * 40503 + rank * 7919).to(dtype)
        want = (torch.arange(1001, dtype=torch.int64) * 40503 + frm * 7919).to(dtype)
        got = torch.full((1001,), 99, dtype=dtype)
        works = [dist.isend(mine, to), dist.irecv(got, frm)]
        for w in works:
            w.wait()
        assert torch.equal(got, want), f"{dtype} from rank {frm}"


@pytest.mark.parametrize("size", [2, 3])
def test_sends_of_types_braid_does_not_reduce_travel_as_bytes(run_ranks, size):
    run_ranks(size, sends_of_types_braid_does_not_reduce, timeout_s=30)


def receive_from_any_source(rank, size):
    """Every other rank sends rank 0 two messages larger than the FIFOs; rank 0 takes all of them
    with receives from any source (blocking and not), each saying its sender: every sender named
    twice, its messages in the order sent."""
    n = BIG // 4
    if rank != 0:
        for salt in (0, 1):
            dist.send(payload(rank, n, salt), 0)
        return
    taken = {}
    for k in range(2 * (size - 1)):
        got = torch.full((n,), POISON)
        if k % 2 == 0:
            source = dist.recv(got)
        else:
            work = dist.irecv(got)
            work.wait()
            source = work._source_rank()
        salt = taken.get(source, 0)
        assert 0 < source < size and salt < 2, f"message {k}: from rank {source} ({salt} before)"
        assert torch.equal(got, payload(source, n, salt)), f"message {k} from rank {source}"
        taken[source] = salt + 1
    assert taken == {r: 2 for r in range(1, size)}, taken


@pytest.mark.parametrize("size", [2, 4])
def test_a_receive_from_any_source_names_its_sender(run_ranks, size):
    run_ranks(size, receive_from_any_source, timeout_s=30)


def any_source_nobody_sends(rank, size):
    """Nobody sends to rank 0's receive from any source: it fails at the timeout, in torch's words
    for one ("Timed out"), and the group goes on."""
    def failure():
        with pytest.raises(RuntimeError, match=" Timed out"):
            dist.recv(torch.zeros(4))

    fails_then_the_group_goes_on(rank, size, 0, "any_source_nobody_sends", failure)


def test_a_receive_from_any_source_that_nobody_sends_to_times_out(run_ranks):
    run_ranks(3, any_source_nobody_sends, timeout_s=3)


def tags_out_of_order(rank, size, n):
    """Rank 0 sends rank 1 three messages tagged 1, 2, 3, alike in size and type (only the tag
    tells them apart); rank 1 receives tag 3, then 1, then 2. Each receive gets the message of its
    tag, as Gloo (and MPI) match them; n larger than braid's FIFOs: rank 0's sends wait
    meanwhile."""
    if rank == 0:
        for work in [dist.isend(payload(0, n, salt=tag), 1, tag=tag) for tag in (1, 2, 3)]:
            work.wait()
    elif rank == 1:
        for tag in (3, 1, 2):
            got = torch.full((n,), POISON)
            dist.recv(got, 0, tag=tag)
            assert torch.equal(got, payload(0, n, salt=tag)), f"tag {tag}: another message"


@pytest.mark.parametrize("backend", ["braid", "gloo"])
@pytest.mark.parametrize("n", [5, BIG // 4])
def test_a_receive_takes_the_message_of_its_tag(run_ranks, backend, n):
    run_ranks(2, tags_out_of_order, n, backend=backend, timeout_s=30)


def tags_of_other_sizes_and_types(rank, size):
    """The messages of two tags differ in size and type, and rank 1 receives the second first:
    matched by tag, neither receive meets the other's message (a mismatch, before)."""
    if rank == 0:
        small, large = payload(0, 3), torch.arange(100000, dtype=torch.int64) * 7
        works = [dist.isend(small, 1, tag=7), dist.isend(large, 1, tag=8)]
        for work in works:
            work.wait()
    elif rank == 1:
        large, small = torch.zeros(100000, dtype=torch.int64), torch.full((3,), POISON)
        dist.recv(large, 0, tag=8)
        dist.recv(small, 0, tag=7)
        assert torch.equal(large, torch.arange(100000, dtype=torch.int64) * 7), "tag 8"
        assert torch.equal(small, payload(0, 3)), "tag 7"


@pytest.mark.parametrize("backend", ["braid", "gloo"])
def test_messages_of_other_tags_may_differ_in_size_and_type(run_ranks, backend):
    run_ranks(2, tags_of_other_sizes_and_types, backend=backend, timeout_s=30)


def any_source_by_tag(rank, size, with_empty):
    """Every other rank sends rank 0 a message tagged 1, then one tagged 2, then an empty one
    tagged 3; rank 0 takes them with receives from any source, every tag-3 one first, then tag 2,
    then 1: each receive gets a message of its tag, from the sender it names, every sender once
    per tag (an empty message too: its sender is known; Gloo's receive of one fails, "offset <
    this->size. 0 vs 0", so with_empty for braid alone)."""
    n = 1000
    sizes = {1: n, 2: n, 3: 0} if with_empty else {1: n, 2: n}
    if rank != 0:
        works = [dist.isend(payload(rank, sizes[tag], salt=tag), 0, tag=tag) for tag in sizes]
        for work in works:
            work.wait()
        return
    for tag in sorted(sizes, reverse=True):
        sources = []
        for _ in range(size - 1):
            got = torch.full((sizes[tag],), POISON)
            work = dist.irecv(got, tag=tag)
            work.wait()
            source = work._source_rank()
            want = payload(source, sizes[tag], salt=tag)
            assert torch.equal(got, want), f"tag {tag} from {source}"
            sources.append(source)
        assert sorted(sources) == list(range(1, size)), f"tag {tag}: {sources}"


@pytest.mark.parametrize("backend", ["braid", "gloo"])
def test_a_receive_from_any_source_takes_a_message_of_its_tag(run_ranks, backend):
    run_ranks(3, any_source_by_tag, backend == "braid", backend=backend, timeout_s=30)


def batch_by_tag(rank, size):
    """One batch_isend_irecv on each rank: rank 0 sends tags 1 and 2, rank 1 posts its receives
    of tag 2, then 1 (P2POp's tag)."""
    n = BIG // 4
    if rank == 0:
        ops = [dist.P2POp(dist.isend, payload(0, n, salt=tag), 1, tag=tag) for tag in (1, 2)]
    else:
        got = {tag: torch.full((n,), POISON) for tag in (2, 1)}
        ops = [dist.P2POp(dist.irecv, got[tag], 0, tag=tag) for tag in (2, 1)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if rank == 1:
        for tag, tensor in got.items():
            assert torch.equal(tensor, payload(0, n, salt=tag)), f"tag {tag}: another message"


@pytest.mark.parametrize("backend", ["braid", "gloo"])
def test_a_batchs_receives_take_the_messages_of_their_tags(run_ranks, backend):
    run_ranks(2, batch_by_tag, backend=backend, timeout_s=30)


def many_tags_in_reverse(rank, size):
    """500 tags, each a message from rank 0 to rank 1, received last tag first: a tag is no
    communicator or thread of its own (500 would not fit), and the other messages wait in rank 1
    until asked for."""
    tags = range(500)
    if rank == 0:
        for work in [dist.isend(payload(0, 64, salt=tag), 1, tag=tag) for tag in tags]:
            work.wait()
    elif rank == 1:
        for tag in reversed(tags):
            got = torch.full((64,), POISON)
            dist.recv(got, 0, tag=tag)
            assert torch.equal(got, payload(0, 64, salt=tag)), f"tag {tag}"


def test_a_receive_may_wait_for_the_last_of_many_tags(run_ranks):
    run_ranks(2, many_tags_in_reverse, timeout_s=60)


def a_receive_of_another_size(rank, size):
    """Rank 1's receive of tag 4 holds 3 floats, rank 0's message of tag 4 holds 5: the receive
    fails naming both sizes, the tag and the sender; the message is consumed, so rank 0's next
    message of tag 4 meets rank 1's next receive, and the group goes on."""
    if rank == 0:
        dist.send(payload(0, 5), 1, tag=4)
        dist.send(payload(0, 3, salt=1), 1, tag=4)
    elif rank == 1:
        with pytest.raises(dist.DistBackendError,
                           match=r"rank 1 received from rank 0 a message of 5 elements of "
                                 r"float32 \(tag 4\), but its receive holds 3 elements of float32"):
            dist.recv(torch.zeros(3), 0, tag=4)
        got = torch.full((3,), POISON)
        dist.recv(got, 0, tag=4)
        assert torch.equal(got, payload(0, 3, salt=1)), "the next message of tag 4"
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), 2.0))


def test_a_receive_of_another_size_fails_and_the_next_message_still_meets(run_ranks):
    run_ranks(2, a_receive_of_another_size, timeout_s=30)


def callback_receives_while_another_tag_waits(rank, size, any_source):
    """Rank 1 posts receives of tags 2 and 1 from rank 0; the tag-1 receive's callback receives
    tag 3 (on the channel's thread: from rank 0, or from any source, rank 2 sending it) and rank 1
    waits for that callback before it lets rank 0 send tag 2. The callback's receive ends with
    its own message: it does not wait for tag 2's."""
    n = 16
    sender_of_3 = 2 if any_source else 0
    if rank == 0:
        dist.send(payload(0, n, salt=1), 1, tag=1)
        if sender_of_3 == 0:
            dist.send(payload(0, n, salt=3), 1, tag=3)
        dist.recv(torch.zeros(1), 1, tag=9)
        dist.send(payload(0, n, salt=2), 1, tag=2)
    elif rank == 1:
        got = {tag: torch.full((n,), POISON) for tag in (1, 2, 3)}
        second = dist.irecv(got[2], 0, tag=2)

        def then(_):
            assert dist.recv(got[3], None if any_source else 0, tag=3) == sender_of_3

        dist.irecv(got[1], 0, tag=1).get_future().then(then).wait()
        dist.send(torch.ones(1), 0, tag=9)
        second.wait()
        for tag, tensor in got.items():
            sender = sender_of_3 if tag == 3 else 0
            assert torch.equal(tensor, payload(sender, n, salt=tag)), f"tag {tag}"
    elif rank == sender_of_3:
        dist.send(payload(2, n, salt=3), 1, tag=3)


@pytest.mark.parametrize("any_source", [False, True])
def test_a_callbacks_receive_ends_with_its_own_message(run_ranks, any_source):
    run_ranks(3 if any_source else 2, callback_receives_while_another_tag_waits, any_source,
              timeout_s=20)


def a_tag_nobody_sends_among_others(rank, size):
    """Rank 0 keeps sending rank 1 messages of tag 1 for twice the group's timeout, never one of
    tag 9: rank 1's receive of tag 9 times out in its own words while the tag-1 messages flow,
    and the channel goes on (rank 1 takes every tag-1 message, then one sent after)."""
    messages = 12
    if rank == 0:
        for k in range(messages):
            dist.send(payload(0, 4, salt=k), 1, tag=1)
            time.sleep(0.5)
        dist.recv(torch.zeros(1), 1, tag=2)
        dist.send(payload(0, 4, salt=messages), 1, tag=1)
    elif rank == 1:
        never = dist.irecv(torch.zeros(4), 0, tag=9)
        for k in range(messages):
            got = torch.full((4,), POISON)
            dist.recv(got, 0, tag=1)
            assert torch.equal(got, payload(0, 4, salt=k)), f"tag-1 message {k}"
        with pytest.raises(dist.DistBackendError,
                           match="a receive on rank 1 from rank 0 \\(tag 9\\): Timed out after "
                                 "[0-9]+ ms, rank 0 sent it no message of its tag"):
            never.wait()
        dist.send(torch.ones(1), 0, tag=2)
        got = torch.full((4,), POISON)
        dist.recv(got, 0, tag=1)
        assert torch.equal(got, payload(0, 4, salt=messages)), "after the timeout"


def test_a_receive_times_out_while_other_tags_flow(run_ranks):
    run_ranks(2, a_tag_nobody_sends_among_others, timeout_s=3)


def any_source_after_a_failed_channel(rank, size):
    """Rank 0's receive from rank 2 fails (rank 2 never sends: its channel is never made); then
    rank 0's receive from any source takes rank 1's message: the failed channel stands down
    rather than failing the receive."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        with pytest.raises(dist.DistBackendError, match="Timed out"):
            dist.recv(torch.zeros(4), 2)
        store.set("channel_from_2_failed", "1")
        got = torch.full((4,), POISON)
        assert dist.recv(got) == 1, "the sender"
        assert torch.equal(got, payload(1, 4)), "rank 1's message"
        store.set("received", "1")
    else:
        if rank == 1:
            store.wait(["channel_from_2_failed"], datetime.timedelta(seconds=60))
            dist.send(payload(1, 4), 0)
        store.wait(["received"], datetime.timedelta(seconds=60))  # not in a collective: 3 s
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(size)))


def test_a_receive_from_any_source_is_not_failed_by_one_failed_channel(run_ranks):
    run_ranks(3, any_source_after_a_failed_channel, timeout_s=3)


def coalesced_works(rank, size):
    """Inside torch's _coalescing_manager each isend and irecv returns a Work: waiting on it, as
    on the manager's, waits for the whole batch (braid completes the batch's Work for every one
    of them; a Work of its own that nobody completed made such a wait last for ever)."""
    if rank > 1:
        return
    peer = 1 - rank
    got = torch.full((BIG,), POISON)
    with dist._coalescing_manager(device=torch.device("cpu")):
        works = [dist.isend(payload(rank, BIG), peer), dist.irecv(got, peer)]
    for work in works:
        work.wait(datetime.timedelta(seconds=15))  # raises if it never completes
    assert torch.equal(got, payload(peer, BIG)), f"rank {rank}: wrong data received"


def test_each_operation_of_a_coalesced_batch_returns_a_work_that_completes(run_ranks):
    run_ranks(2, coalesced_works, timeout_s=20)


def coalesced_gather_and_scatter(rank, size):
    """all_gather_into_tensor and reduce_scatter_tensor calls in torch's _coalescing_manager reach
    the backend as one *_coalesced call each, which braid issues as one group (small calls that
    agree run as one pass, larger ones alone): pieces of 12 B to 80 KB on both sides of
    BRAID_GROUP_FUSE_BYTES, two dtypes, outputs that are not contiguous (written back after the
    group), SUM, MAX and BOR (issued one by one). Outputs poisoned; references computed here."""
    f32, i32 = torch.float32, torch.int32
    counts, dtypes = [3, 1000, 5, 20000, 7, 4, 6], [f32, f32, i32, f32, f32, i32, i32]

    def piece(r, i):  # rank r's i-th input (all-gather), or its i-th input's block (reduce-scatter)
        return (torch.arange(counts[i]) % 97 * (r + 1) + 3 * i).to(dtypes[i])

    def strided(n, dtype):  # every other element of a poisoned buffer
        return torch.full((2 * n,), POISON).to(dtype)[::2]

    outs = [strided(size * n, t) if i % 2 else torch.full((size * n,), POISON).to(t)
            for i, (n, t) in enumerate(zip(counts, dtypes))]
    with dist._coalescing_manager(device=torch.device("cpu")):
        for i, out in enumerate(outs):
            dist.all_gather_into_tensor(out, piece(rank, i))
    for i, out in enumerate(outs):
        want = torch.cat([piece(r, i) for r in range(size)])
        assert torch.equal(out, want), f"rank {rank}: all-gather {i} ({counts[i]} x {dtypes[i]})"

    for op, combine in ((dist.ReduceOp.SUM, torch.add), (dist.ReduceOp.MAX, torch.maximum),
                        (dist.ReduceOp.BOR, torch.bitwise_or)):
        kept = [i for i in range(len(counts)) if op != dist.ReduceOp.BOR or dtypes[i] == torch.int32]
        # Rank r's input for call i: block b is piece(r * size + b, i).
        inputs = {i: torch.cat([piece(rank * size + b, i) for b in range(size)]) for i in kept}
        outs = {i: strided(counts[i], dtypes[i]) if i % 2 else
                torch.full((counts[i],), POISON).to(dtypes[i]) for i in kept}
        with dist._coalescing_manager(device=torch.device("cpu")):
            for i in kept:
                dist.reduce_scatter_tensor(outs[i], inputs[i], op=op)
        for i in kept:
            want = piece(rank, i)
            for r in range(1, size):
                want = combine(want, piece(r * size + rank, i))
            assert torch.equal(outs[i], want), f"rank {rank}: {op} reduce-scatter {i}"


@pytest.mark.parametrize("size", [2, 3])
def test_coalesced_all_gathers_and_reduce_scatters_run_as_one_group(run_ranks, size):
    run_ranks(size, coalesced_gather_and_scatter, timeout_s=60)


def coalesced_calls_as_one_pass_and_refusals(rank, size):
    """The block's calls are one braid group: the second all-gather, whose input is the first's
    output, reads it as it was before the block (they run as one pass, as docs/core.md says; one
    by one it would read the first's result). A block braid refuses (an output of the wrong size,
    an output and input of different dtypes, a dtype braid lacks) fails on the caller's thread on
    every rank, and leaves no group open: a later all_reduce is right."""
    n = 4
    first_in = torch.full((n,), float(rank + 1))
    first_out = torch.full((size * n,), POISON)
    second_out = torch.full((size * n,), POISON)
    with dist._coalescing_manager(device=torch.device("cpu")):
        dist.all_gather_into_tensor(first_out, first_in)
        dist.all_gather_into_tensor(second_out, first_out[:n])
    want = torch.cat([torch.full((n,), float(r + 1)) for r in range(size)])
    assert torch.equal(first_out, want), first_out
    assert torch.equal(second_out, torch.full((size * n,), POISON)), second_out

    refused = [(torch.zeros(size * n + 1), torch.ones(n), "elements"),
               (torch.zeros(size * n, dtype=torch.float64), torch.ones(n), "differ"),
               (torch.zeros(size * n, dtype=torch.int16), torch.ones(n, dtype=torch.int16), "tensors of type")]
    for out, inp, words in refused:
        with pytest.raises((RuntimeError, ValueError), match=words):
            with dist._coalescing_manager(device=torch.device("cpu")):
                dist.all_gather_into_tensor(torch.zeros(size * n), torch.ones(n))
                dist.all_gather_into_tensor(out, inp)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    assert total.item() == size * (size + 1) / 2, total


@pytest.mark.parametrize("size", [2, 3])
def test_coalesced_calls_run_as_one_pass_and_refusals_leave_no_group_open(run_ranks, size):
    run_ranks(size, coalesced_calls_as_one_pass_and_refusals, timeout_s=60)


def coalesced_failure(rank, size):
    """torch's _coalescing_manager(device=...) waits on the block's Work alone (it drops the
    coalesced call's): a collective of the block that fails where it runs (a bitwise operator on a
    float tensor, refused on every rank before anything moves) fails that Work too, instead of
    leaving its outputs untouched behind a wait that succeeds. Waited at once and with async_ops."""
    t = torch.full((4,), 2.0)
    with pytest.raises(RuntimeError, match="bitwise reduce op on a Float tensor"):
        with dist._coalescing_manager(device=torch.device("cpu")):
            dist.all_reduce(t, op=dist.ReduceOp.BAND)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as manager:
        dist.all_reduce(t, op=dist.ReduceOp.BAND)
    with pytest.raises(RuntimeError, match="bitwise reduce op on a Float tensor"):
        manager.wait()
    ok = torch.full((4,), float(rank))
    with dist._coalescing_manager(device=torch.device("cpu")):
        dist.all_reduce(ok)
    assert torch.equal(ok, torch.full((4,), float(sum(range(size))))), ok


def test_a_failed_collective_of_a_coalesced_block_fails_the_blocks_work(run_ranks):
    run_ranks(2, coalesced_failure, timeout_s=60)


def monitored_barrier_while_rank_0_is_late(rank, size):
    """Rank 1 waits in a monitored barrier for rank 0, which comes late: meanwhile rank 2 sees
    rank 1's wait counted among the meetings through the store (so that rank 0, leaving as soon
    as it released the others, keeps its store until they saw the release); after, none is."""
    if rank == 0:
        time.sleep(1)
    if rank == 2:
        deadline = time.monotonic() + 20
        while meetings_in_flight() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert meetings_in_flight() >= 1, "rank 1's wait for rank 0 is not counted"
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
    dist.barrier()
    deadline = time.monotonic() + 20
    while meetings_in_flight() != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert meetings_in_flight() == 0, f"rank {rank}: {meetings_in_flight()} meetings left counted"


def test_a_monitored_barriers_waits_count_as_meetings(run_ranks):
    run_ranks(3, monitored_barrier_while_rank_0_is_late, timeout_s=30)


def monitored_barrier_absent_ranks(rank, size):
    """Ranks 1 and 2 never come to rank 0's monitored barrier: rank 0 names both
    (wait_all_ranks), each after the whole timeout; then every rank meets in a plain barrier."""
    if rank == 0:
        with pytest.raises(RuntimeError, match="Ranks 1, 2 failed to pass monitoredBarrier"):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=0.2), wait_all_ranks=True)
    dist.barrier()


def test_monitored_barrier_names_every_absent_rank_as_gloo(run_ranks):
    run_ranks(3, monitored_barrier_absent_ranks, timeout_s=30)


def gather_layout(rank, size):
    gloo = dist.new_group(backend="gloo")
    # Inputs of two shapes; torch's contract: output_tensor_lists[rank][input].
    inputs = [torch.full((2,), 10.0 * rank), torch.full((3,), 10.0 * rank + 1)]
    results = []
    for group in (None, gloo):
        outs = [[torch.full((2,), POISON), torch.full((3,), POISON)] for _ in range(size)]
        dist.all_gather_coalesced(outs, inputs, group=group)
        results.append(outs)
    for r in range(size):
        assert torch.equal(results[0][r][0], torch.full((2,), 10.0 * r)), results[0]
        assert torch.equal(results[0][r][1], torch.full((3,), 10.0 * r + 1)), results[0]
        for i in range(2):
            assert torch.equal(results[0][r][i], results[1][r][i]), "not as Gloo"


@pytest.mark.parametrize("size", [2, 3])
def test_all_gather_coalesced_lays_out_rank_then_input_as_gloo(run_ranks, size):
    run_ranks(size, gather_layout)


def reduce_aliased(rank, size):
    """One tensor twice in the list: reduced once, as Gloo does (the list is flattened first)."""
    gloo = dist.new_group(backend="gloo")
    results = []
    for group in (None, gloo):
        shared, other = torch.full((4,), float(rank + 3)), torch.full((2, 3), float(rank))
        dist.all_reduce_coalesced([shared, other, shared], group=group)
        results.append((shared, other))
    want = float(sum(r + 3 for r in range(size)))
    assert torch.equal(results[0][0], torch.full((4,), want)), results[0][0]
    assert torch.equal(results[0][1], torch.full((2, 3), float(sum(range(size)))))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("size", [2, 3])
def test_all_reduce_coalesced_reduces_a_tensor_listed_twice_once(run_ranks, size):
    run_ranks(size, reduce_aliased)


def uneven_reduce_scatter(rank, size):
    def chunk(src, dst, n):
        g = torch.Generator().manual_seed(100 * src + dst)
        return torch.randint(-9, 10, (n,), generator=g).float()

    # Slightly uneven (padded into one reduce-scatter) and, from 3 ranks, so uneven (one large
    # piece) that one all-reduce moves less; an empty piece; MIN and MAX, where padding that
    # leaked into a result would show.
    for counts in ([r + 1 for r in range(size)], [0] + [1] * (size - 2) + [50000]):
        for op, combine in ((dist.ReduceOp.SUM, torch.add), (dist.ReduceOp.MIN, torch.minimum),
                            (dist.ReduceOp.MAX, torch.maximum)):
            pieces = [chunk(rank, dst, counts[dst]) for dst in range(size)]
            out = torch.full((counts[rank],), POISON)
            dist.reduce_scatter(out, pieces, op=op)
            want = chunk(0, rank, counts[rank])
            for src in range(1, size):
                want = combine(want, chunk(src, rank, counts[rank]))
            assert torch.equal(out, want), f"reduce_scatter {counts} {op}: {out} vs {want}"


@pytest.mark.parametrize("size", [2, 3])
def test_reduce_scatter_takes_uneven_inputs(run_ranks, size):
    run_ranks(size, uneven_reduce_scatter)


def sparse_of(rank, salt=0):
    """A 2-D sparse COO tensor (10 x 3) with rank-dependent rows, a repeated index among them."""
    rows = torch.tensor([rank % 10, (rank * 3 + salt) % 10, rank % 10])
    values = torch.arange(9, dtype=torch.float32).reshape(3, 3) + rank + salt
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, (10, 3))


def sparse_all_reduce(rank, size):
    gloo = dist.new_group(backend="gloo")
    t, with_gloo = sparse_of(rank), sparse_of(rank)
    dist.all_reduce(t)
    dist.all_reduce(with_gloo, group=gloo)
    want = sum(sparse_of(r).to_dense() for r in range(size))
    assert t.is_sparse and torch.equal(t.to_dense(), want), f"{t.to_dense()} vs {want}"
    assert torch.equal(t.to_dense(), with_gloo.to_dense()), "not as Gloo"
    work = dist.all_reduce(sparse_of(rank, salt=1), async_op=True)
    (result,) = work.get_future().wait()
    assert torch.equal(result.to_dense(), sum(sparse_of(r, 1).to_dense() for r in range(size)))
    # Ops other than SUM: refused in braid's words on every rank, and the group goes on.
    with pytest.raises(Exception, match="braid backend: .*sparse"):
        dist.all_reduce(sparse_of(rank), op=dist.ReduceOp.MAX)
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(size)))


def sparse_ddp(rank, size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    results = []
    for group in (None, gloo):
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.EmbeddingBag(50, 8, mode="sum", sparse=True),
                                  nn.Linear(8, 1)), process_group=group)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(20):
            g = torch.Generator().manual_seed(31 * step + rank)
            words = torch.randint(0, 50, (6, 4), generator=g)
            loss = (model(words) - 1.0).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("size", [2, 3])
def test_sparse_all_reduce_sums_as_gloo(run_ranks, size):
    run_ranks(size, sparse_all_reduce)


def test_ddp_with_sparse_gradients_matches_gloo(run_ranks):
    run_ranks(2, sparse_ddp)
