package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"

	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	"google.golang.org/protobuf/proto"
)

// The journal (state.pb.journal) holds the changes made since the snapshot in the state
// file was written: a 12-byte header, then one frame per change:
//
//	header: magic "LBDJOURN" | format version (uint32 BE)
//	frame:  payload length (uint32 BE) | CRC-32C of payload (uint32 BE) | statev1.JournalEntry
//
// An entry is synced before its change is acknowledged. A crash while appending leaves
// a partial last frame, which was never acknowledged: it is cut off at the next start.
// A damaged frame followed by others is corruption.
const (
	journalMagic   = "LBDJOURN"
	journalVersion = 1
	journalHdrLen  = 8 + 4
	frameHdrLen    = 4 + 4
	// maxEntryLen bounds one entry: far above what the limits allow (16,384 services
	// of 1,024 backends are about 2 GiB only with absurd names), so that a damaged
	// length is not taken for a huge entry.
	maxEntryLen = 1 << 30
)

// JournalSuffix names the journal: the state file's path with this suffix.
const JournalSuffix = ".journal"

func journalHeader() []byte {
	h := make([]byte, journalHdrLen)
	copy(h, journalMagic)
	binary.BigEndian.PutUint32(h[8:], journalVersion)
	return h
}

// encodeFrame frames one entry.
func encodeFrame(e *statev1.JournalEntry) ([]byte, error) {
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("marshal journal entry: %w", err)
	}
	if len(payload) > maxEntryLen {
		return nil, fmt.Errorf("journal entry of %d bytes exceeds %d", len(payload), maxEntryLen)
	}
	buf := make([]byte, frameHdrLen, frameHdrLen+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	binary.BigEndian.PutUint32(buf[4:], crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

// journal is a decoded journal file.
type journal struct {
	entries []*statev1.JournalEntry
	// good is the length of the journal up to its last whole entry; torn how many bytes
	// after it belong to an entry whose write did not finish.
	good, torn int64
	exists     bool
}

// readJournal decodes the journal at path; a missing file is an empty journal.
func readJournal(path string) (*journal, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &journal{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	return decodeJournal(data)
}

func decodeJournal(data []byte) (*journal, error) {
	j := &journal{exists: true}
	hdr := journalHeader()
	if len(data) < journalHdrLen {
		// A crash while the journal was being created.
		if !bytes.HasPrefix(hdr, data) {
			return nil, fmt.Errorf("%w: journal: %d bytes that are not a journal header", ErrCorruptState, len(data))
		}
		j.torn = int64(len(data))
		return j, nil
	}
	if !bytes.Equal(data[:8], hdr[:8]) {
		return nil, fmt.Errorf("%w: journal: it does not start with %q", ErrCorruptState, journalMagic)
	}
	if v := binary.BigEndian.Uint32(data[8:]); v != journalVersion {
		return nil, fmt.Errorf("%w: journal: format version %d, this lbd reads version %d", ErrCorruptState, v, journalVersion)
	}
	off := journalHdrLen
	for off < len(data) {
		rest := data[off:]
		if len(rest) < frameHdrLen {
			break // torn
		}
		n := int(binary.BigEndian.Uint32(rest))
		if n > len(rest)-frameHdrLen {
			break // torn
		}
		payload := rest[frameHdrLen : frameHdrLen+n]
		if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(rest[4:]) {
			if frameHdrLen+n == len(rest) {
				break // the last frame, half written
			}
			return nil, fmt.Errorf("%w: journal: checksum mismatch in the entry at byte %d, which other entries follow", ErrCorruptState, off)
		}
		e := &statev1.JournalEntry{}
		if err := proto.Unmarshal(payload, e); err != nil {
			return nil, fmt.Errorf("%w: journal: entry at byte %d: %v", ErrCorruptState, off, err)
		}
		j.entries = append(j.entries, e)
		off += frameHdrLen + n
	}
	j.good, j.torn = int64(off), int64(len(data)-off)
	return j, nil
}

// replay applies the journal's entries that follow the snapshot st to it, and returns
// the sequence number of the last change st then holds.
func (j *journal) replay(st *statev1.State) (uint64, error) {
	seq := st.Sequence
	var svcs map[string]int // index in st.Services, built on the first entry to apply
	for _, e := range j.entries {
		if e.Sequence <= st.Sequence {
			continue // written before the snapshot, which holds it
		}
		if e.Sequence != seq+1 {
			return 0, fmt.Errorf("%w: journal: change %d follows change %d: changes are missing (is the state file older than its journal?)",
				ErrCorruptState, e.Sequence, seq)
		}
		if svcs == nil {
			svcs = make(map[string]int, len(st.Services))
			for i, svc := range st.Services {
				svcs[svc.Name] = i
			}
		}
		for _, name := range e.DeletedServices {
			if i, ok := svcs[name]; ok {
				st.Services[i] = nil
				delete(svcs, name)
			}
		}
		for _, svc := range e.Services {
			if i, ok := svcs[svc.Name]; ok {
				st.Services[i] = svc
				continue
			}
			svcs[svc.Name] = len(st.Services)
			st.Services = append(st.Services, svc)
		}
		peers := map[string]bool{}
		for _, a := range e.DeletedBgpPeers {
			peers[a] = true
		}
		for _, p := range e.BgpPeers {
			peers[p.Address] = true
		}
		kept := st.BgpPeers[:0]
		for _, p := range st.BgpPeers {
			if !peers[p.Address] {
				kept = append(kept, p)
			}
		}
		st.BgpPeers = append(kept, e.BgpPeers...)
		if e.NodeDrained != nil {
			st.NodeDrained = *e.NodeDrained
		}
		seq = e.Sequence
	}
	n := 0
	for _, svc := range st.Services {
		if svc != nil {
			st.Services[n] = svc
			n++
		}
	}
	st.Services = st.Services[:n]
	return seq, nil
}
