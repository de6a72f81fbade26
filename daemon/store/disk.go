package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
)

// minCompact is the journal size below which the snapshot is never rewritten: small
// states would otherwise be rewritten on every change.
const minCompact = 1 << 20

// disk keeps the desired state on disk as a snapshot (the state file) and a journal of
// the changes since. A change costs the append and sync of its own entry, whatever the
// size of the state; once the journal outgrows the snapshot, a new snapshot is written
// in the background and the journal restarts after it. Writing a snapshot of S bytes
// after at least S bytes of changes keeps the cost per change proportional to the change.
//
// Every field is guarded by lock (the store's writeMu), which the background snapshot
// takes only to switch journals.
type disk struct {
	path, jpath string
	log         hclog.Logger
	lock        sync.Locker

	j         *os.File // the journal, open for appending
	size      int64    // its length
	seq       uint64   // sequence of the last change written
	snapBytes int64    // length of the last snapshot
	// retryAt is the journal length at which a compaction is tried again after one failed.
	retryAt int64
	// broken is set when the journal may end in part of a refused change: a snapshot
	// and a fresh journal are written before the next append.
	broken bool
	closed bool
	// compacting is closed when the running compaction ends; nil while none runs.
	compacting chan struct{}
}

// loadDisk reads the snapshot and the journal at path and returns the state they hold
// together, and the disk to go on with once the store accepted that state (start).
// Nothing is written.
func loadDisk(path string, log hclog.Logger, lock sync.Locker) (*disk, *statev1.State, *journal, error) {
	d := &disk{path: path, jpath: path + JournalSuffix, log: log, lock: lock}
	st, size, err := readStateFile(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	d.snapBytes = size
	j, err := readJournal(d.jpath)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", d.jpath, err)
	}
	if st == nil {
		st = &statev1.State{}
	}
	if d.seq, err = j.replay(st); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", d.jpath, err)
	}
	return d, st, j, nil
}

// start opens the journal for appending: it cuts off a partial last entry, or creates
// the journal.
func (d *disk) start(j *journal) error {
	if !j.exists || j.good == 0 {
		return d.newJournal()
	}
	f, err := os.OpenFile(d.jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	if j.torn > 0 {
		if err := f.Truncate(j.good); err != nil {
			f.Close()
			return fmt.Errorf("cut off the journal's partial last entry: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("sync journal: %w", err)
		}
		d.log.Warn("journal ended in a partial entry, a change that was never acknowledged: cut off",
			"op", "restore", "path", d.jpath, "bytes", j.torn)
	}
	d.j, d.size = f, j.good
	return nil
}

// newJournal replaces the journal with an empty one.
func (d *disk) newJournal() error {
	if err := writeFileAtomic(d.jpath, journalHeader()); err != nil {
		return fmt.Errorf("create journal: %w", err)
	}
	f, err := os.OpenFile(d.jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	if d.j != nil {
		d.j.Close()
	}
	d.j, d.size = f, journalHdrLen
	return nil
}

// append writes and syncs one change. On error the change must be refused: the journal
// is cut back, and rewritten whole before the next change (snap gives the state as it
// stands before that change).
func (d *disk) append(e *statev1.JournalEntry, snap func() *statev1.State) error {
	if d.closed {
		return errors.New("the store is closed")
	}
	if d.broken {
		if err := d.rewrite(snap()); err != nil {
			return err
		}
	}
	e.Sequence = d.seq + 1
	frame, err := encodeFrame(e)
	if err != nil {
		return err
	}
	_, err = d.j.Write(frame)
	if err == nil {
		err = d.j.Sync()
	}
	if err != nil {
		// After a failed write or sync, what the file holds is unknown: cut the entry
		// off so that a crash now does not replay a refused change, and start over
		// from a snapshot next time.
		_ = d.j.Truncate(d.size)
		d.broken = true
		return fmt.Errorf("append to journal: %w", err)
	}
	d.seq++
	d.size += int64(len(frame))
	return nil
}

// rewrite writes st as the snapshot and starts an empty journal after it.
func (d *disk) rewrite(st *statev1.State) error {
	st.Sequence = d.seq
	data, err := encodeState(st)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(d.path, data); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	d.snapBytes = int64(len(data))
	if err := d.newJournal(); err != nil {
		return err
	}
	d.broken, d.retryAt = false, 0
	return nil
}

// threshold is the journal length past which a new snapshot is written.
func (d *disk) threshold() int64 {
	return journalHdrLen + max(d.snapBytes, minCompact, d.retryAt)
}

// maybeCompact starts writing a new snapshot in the background once the journal has
// outgrown the last one. snap gives the state as of the journal's last entry.
func (d *disk) maybeCompact(snap func() *statev1.State) {
	if d.compacting != nil || d.broken || d.closed || d.size < d.threshold() {
		return
	}
	st := snap()
	st.Sequence = d.seq
	done := make(chan struct{})
	d.compacting = done
	upTo := d.size
	go func() {
		defer close(done)
		d.compact(st, upTo)
	}()
}

// compact writes st as the snapshot, then drops the journal's first upTo bytes, which
// it holds: the entries appended meanwhile move to a fresh journal. A crash between the
// two steps leaves entries the snapshot holds in the journal, which replay skips.
func (d *disk) compact(st *statev1.State, upTo int64) {
	start := time.Now()
	data, err := encodeState(st)
	if err == nil {
		err = writeFileAtomic(d.path, data)
	}
	d.lock.Lock()
	defer d.lock.Unlock()
	d.compacting = nil
	if err != nil {
		d.retryAt = d.size + max(d.snapBytes, minCompact) - journalHdrLen
		d.log.Error("state snapshot not written; the journal keeps every change", "op", "persist", "path", d.path, "error", err)
		return
	}
	d.snapBytes = int64(len(data))
	if err := d.trim(upTo); err != nil {
		// The old journal is intact and still appended to; replay skips what the new
		// snapshot holds.
		d.retryAt = d.size + max(d.snapBytes, minCompact) - journalHdrLen
		d.log.Error("journal not shortened after a snapshot", "op", "persist", "path", d.jpath, "error", err)
		return
	}
	d.retryAt = 0
	d.log.Debug("state snapshot written", "op", "persist", "path", d.path, "sequence", st.Sequence,
		"bytes", len(data), "journal_bytes", d.size, "took", time.Since(start))
}

// trim replaces the journal with one that holds only what follows its first upTo bytes.
// Caller holds lock.
func (d *disk) trim(upTo int64) error {
	r, err := os.Open(d.jpath)
	if err != nil {
		return err
	}
	defer r.Close()
	tail := make([]byte, d.size-upTo)
	if _, err := r.ReadAt(tail, upTo); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read journal: %w", err)
	}
	if err := writeFileAtomic(d.jpath, append(journalHeader(), tail...)); err != nil {
		return err
	}
	f, err := os.OpenFile(d.jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		// The new journal is in place but cannot be appended to: start over.
		d.broken = true
		return fmt.Errorf("open journal: %w", err)
	}
	d.j.Close()
	d.j, d.size = f, journalHdrLen+int64(len(tail))
	return nil
}

// close waits for a running compaction, writes a last snapshot so that the state file
// alone holds the state, and closes the journal. Further changes are refused.
func (d *disk) close(snap func() *statev1.State) error {
	for {
		d.lock.Lock()
		c := d.compacting
		if c == nil {
			break
		}
		d.lock.Unlock()
		<-c
	}
	defer d.lock.Unlock()
	if d.closed || d.j == nil {
		return nil
	}
	d.closed = true
	var err error
	if d.size > journalHdrLen || d.broken {
		err = d.rewrite(snap())
	}
	if d.j != nil {
		err = errors.Join(err, d.j.Close())
	}
	return err
}
