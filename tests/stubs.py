"""Stand-ins for a Kafka source in tests of the run loop (faults a broker cannot produce on
demand)."""

from __future__ import annotations


class ScriptedSource:
    """Polls return scripted record lists; records which max_messages each poll asked for.

    A rebalance as a broker runs it inside a poll: ``revoke_after_poll=k`` revokes the
    ``revoked`` partitions during poll k after its records were fetched (they, and every
    earlier record of those partitions, were fetched under the ended assignment);
    ``regain_in_poll=k`` revokes them and gives them back during poll k before its records are
    fetched (those are read under the new assignment, the earlier ones are not)."""

    total = None

    def __init__(self, polls, revoke_after_poll=None, revoked=frozenset(), regain_in_poll=None):
        self.polls = list(polls)
        self.asked: list[int] = []
        self.revoke_after_poll, self.revoked = revoke_after_poll, set(revoked)
        self.regain_in_poll = regain_in_poll
        self.epoch: dict = {}  # (topic, partition) -> its assignment's epoch
        self.pending = False
        self.rewound = self.committed = 0

    @property
    def exhausted(self):
        return not self.polls

    def _rebalance(self):
        for key in self.revoked:
            self.epoch[key] = self.epoch.get(key, 1) + 1
        self.pending = True

    def poll(self, max_messages, timeout_s):
        self.asked.append(max_messages)
        if len(self.asked) == self.regain_in_poll:
            self._rebalance()
        batch = self.polls.pop(0) if self.polls else []
        assert len(batch) <= max_messages
        for r in batch:
            r.epoch = self.epoch.setdefault((r.topic, r.partition), 1)
        if len(self.asked) == self.revoke_after_poll:
            self._rebalance()
        return batch

    def take_revoked(self):
        out, self.pending = self.pending, False
        return out

    def owns(self, rec):
        return rec.epoch == self.epoch.get((rec.topic, rec.partition), 1)

    def commit(self, batch):
        self.committed += 1

    def rewind(self):
        self.rewound += 1

    def lag(self):
        return {}

    def close(self):
        pass
