"""SQLite persistence of what must survive a coordinator or learner restart: the prompt cursor,
prompts handed out but not yet returned, accepted-but-untrained rollout groups, the batch
assigned to each learner step, the latest published version and the counters.

Every mutation commits before the coordinator answers, so an acknowledged rollout is durable.
Groups of steps the learner has checkpointed are deleted (`compact`) and their pages handed
back to the file system, so the file stays the size of the unfinished work, not of the run
(a group of 8 x 1,024 tokens is about 230 KB).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

from echo2.protocol.messages import TrainGroup

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending (prompt_index INTEGER PRIMARY KEY, lease_id TEXT);
CREATE TABLE IF NOT EXISTS groups (
  lease_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL,
  step INTEGER, payload TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (step INTEGER PRIMARY KEY, lease_ids TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS offers (
  version INTEGER NOT NULL, form TEXT NOT NULL, info TEXT NOT NULL, PRIMARY KEY (version, form));
"""
_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL


class GroupState(StrEnum):
    """Where a submitted group is: buffered until trained in exactly one step's batch, or
    dropped as stale, rejected by the learner, or dropped with its quarantined worker."""

    BUFFERED = "buffered"
    TRAINED = "trained"
    DROPPED = "dropped"
    REJECTED = "rejected"
    QUARANTINED = "quarantined"


# states of groups that no future request reads once their step is checkpointed: trained ones
# are never served again; dropped (stale), rejected and quarantined ones never trained (their
# prompts, where redone, are queued by index)
_RETIRED_STATES = tuple(state.value for state in GroupState if state is not GroupState.BUFFERED)


def _refuse_an_older_layout(db: sqlite3.Connection, path: Path) -> None:
    """A store written before protocol 6 keyed its groups by `group_id` (now `lease_id`): say
    so, rather than fail on the first query."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(groups)")}
    if "group_id" in columns:
        db.close()
        raise ValueError(f"{path} was written by an echo2 release before protocol 6 (its groups are keyed by "
                         "group_id): finish that run with the release that started it, or start a new run_dir")


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)  # explicit transactions below
        # freed pages go back to the file system on `compact`; a store made before compaction
        # existed is rebuilt once to get there (auto_vacuum can only change through VACUUM)
        self.db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        if self.db.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
            self.db.execute("VACUUM")
        # WAL + NORMAL: durable across process crashes (what we need), cheap per commit
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        _refuse_an_older_layout(self.db, path)
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    def tx(self):
        """`with store.tx():` groups several writes into one atomic commit."""
        return _Transaction(self.db)

    # ---- meta ----
    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    # ---- prompts handed out (lease_id NULL: waiting to be leased again) ----
    def set_pending(self, prompt_index: int, lease_id: str | None) -> None:
        self.db.execute("INSERT OR REPLACE INTO pending VALUES (?, ?)", (prompt_index, lease_id))

    def clear_pending(self, prompt_index: int) -> None:
        self.db.execute("DELETE FROM pending WHERE prompt_index=?", (prompt_index,))

    def pending_prompts(self) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT prompt_index FROM pending ORDER BY prompt_index")]

    # ---- rollout groups ----
    def add_group(self, group: TrainGroup, seq: int) -> None:
        self.db.execute("INSERT INTO groups VALUES (?, ?, ?, NULL, ?)",
                        (group.lease_id, seq, GroupState.BUFFERED.value, group.model_dump_json()))

    def set_group_state(self, lease_ids: list[str], state: GroupState, step: int | None = None) -> None:
        self.db.executemany(
            "UPDATE groups SET state=?, step=? WHERE lease_id=?", [(state.value, step, g) for g in lease_ids]
        )

    def groups_in_state(self, state: GroupState) -> list[TrainGroup]:
        rows = self.db.execute("SELECT payload FROM groups WHERE state=? ORDER BY seq", (state.value,))
        return [TrainGroup.model_validate_json(r[0]) for r in rows]

    def has_groups(self, state: GroupState, step: int) -> bool:
        row = self.db.execute("SELECT 1 FROM groups WHERE state=? AND step=? LIMIT 1", (state.value, step)).fetchone()
        return row is not None

    def group_seqs(self, lease_ids: Iterable[str]) -> dict[str, int]:
        """lease id -> seq of those stored (one primary-key lookup each: a step's batch at a time)."""
        found = {}
        for lease_id in lease_ids:
            row = self.db.execute("SELECT seq FROM groups WHERE lease_id=?", (lease_id,)).fetchone()
            if row is not None:
                found[lease_id] = row[0]
        return found

    def max_seq(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(seq), -1) FROM groups").fetchone()[0]

    # ---- batches ----
    def save_batch(self, step: int, lease_ids: list[str]) -> None:
        self.db.execute("INSERT OR REPLACE INTO batches VALUES (?, ?)", (step, json.dumps(lease_ids)))

    def batch(self, step: int) -> list[TrainGroup] | None:
        row = self.db.execute("SELECT lease_ids FROM batches WHERE step=?", (step,)).fetchone()
        if row is None:
            return None
        ids = json.loads(row[0])
        placeholders = ",".join("?" * len(ids))
        rows = self.db.execute(f"SELECT lease_id, payload FROM groups WHERE lease_id IN ({placeholders})", ids)
        by_id = {gid: TrainGroup.model_validate_json(payload) for gid, payload in rows}
        return [by_id[g] for g in ids]

    def delete_batch(self, step: int) -> None:
        self.db.execute("DELETE FROM batches WHERE step=?", (step,))

    def last_batch_step(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(step), -1) FROM batches").fetchone()[0]

    # ---- the version forms the learner's origin serves (delta catch-up plans) ----
    def keep_offers(self, offers: dict[tuple[int, str], str], *, replace: bool = False) -> None:
        """Make the stored forms exactly `offers` ((version, form) -> its VersionInfo as JSON):
        forms no longer served go, new ones are added, the others are not written again (a
        manifest is tens of KB at real sizes). `replace`: a restarted learner's origin serves
        them now, so every one is written anew."""
        if replace:
            self.db.execute("DELETE FROM offers")
        stored = set(self.db.execute("SELECT version, form FROM offers").fetchall())
        self.db.executemany("DELETE FROM offers WHERE version=? AND form=?", sorted(stored - set(offers)))
        self.db.executemany("INSERT INTO offers VALUES (?, ?, ?)",
                            [(version, form, offers[version, form]) for version, form in sorted(set(offers) - stored)])

    def offers(self) -> list[str]:
        """The stored forms' VersionInfo JSON, oldest version first."""
        return [r[0] for r in self.db.execute("SELECT info FROM offers ORDER BY version, form")]

    # ---- compaction ----
    def compact(self, before_step: int) -> int:
        """Delete the batches of steps < `before_step` and the retired groups of those steps (call
        inside `tx()`); returns the number of groups deleted. `reclaim()` afterwards returns the
        space."""
        placeholders = ",".join("?" * len(_RETIRED_STATES))
        deleted = self.db.execute(f"DELETE FROM groups WHERE step < ? AND state IN ({placeholders})",
                                  (before_step, *_RETIRED_STATES)).rowcount
        self.db.execute("DELETE FROM batches WHERE step < ?", (before_step,))
        return deleted

    def reclaim(self) -> None:
        """Hand freed pages back to the file system: the database file shrinks, and the WAL,
        checkpointed into it, is truncated to nothing."""
        # through executescript: execute() frees one page only (measured with sqlite 3.40)
        self.db.executescript("PRAGMA incremental_vacuum;")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def size_bytes(self) -> int:
        """The database's size on disk, its WAL included."""
        main = Path(self.db.execute("PRAGMA database_list").fetchone()[2])
        return sum(p.stat().st_size for p in (main, main.with_name(main.name + "-wal")) if p.is_file())


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
