package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"

	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	"google.golang.org/protobuf/proto"
)

// The state file is a 24-byte header followed by a statev1.State in protobuf binary form:
//
//	magic "LBDSTATE" | format version (uint32 BE) | payload length (uint64 BE) | CRC-32C of payload (uint32 BE)
//
// The length and checksum let a truncated or overwritten file be told apart from a valid
// one, which protobuf alone cannot do (a truncated message often still parses).
const (
	stateMagic   = "LBDSTATE"
	stateVersion = 1
	headerLen    = 8 + 4 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorruptState is wrapped by every error about a state file that exists but cannot be
// trusted. The daemon refuses to start on it and leaves the file untouched.
var ErrCorruptState = errors.New("corrupt state file")

// RecoveryHint tells an operator what to do about an unreadable state file.
const RecoveryHint = "lbd leaves the file untouched and will not start with it. To recover, restore the state file " +
	"and its journal (state.pb and state.pb.journal) from a backup taken together, or move both aside to start with an " +
	"empty state (services and peers must then be created again; a Kubernetes adapter re-applies its services by itself)"

func encodeState(st *statev1.State) ([]byte, error) {
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("marshal state: %w", err)
	}
	buf := make([]byte, headerLen, headerLen+len(payload))
	copy(buf, stateMagic)
	binary.BigEndian.PutUint32(buf[8:], stateVersion)
	binary.BigEndian.PutUint64(buf[12:], uint64(len(payload)))
	binary.BigEndian.PutUint32(buf[20:], crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

func decodeState(data []byte) (*statev1.State, error) {
	if len(data) < headerLen {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the %d-byte header (truncated?)", ErrCorruptState, len(data), headerLen)
	}
	if !bytes.Equal(data[:8], []byte(stateMagic)) {
		return nil, fmt.Errorf("%w: it does not start with %q (not an lbd state file?)", ErrCorruptState, stateMagic)
	}
	if v := binary.BigEndian.Uint32(data[8:]); v != stateVersion {
		return nil, fmt.Errorf("%w: format version %d, this lbd reads version %d", ErrCorruptState, v, stateVersion)
	}
	payload := data[headerLen:]
	if n := binary.BigEndian.Uint64(data[12:]); n != uint64(len(payload)) {
		return nil, fmt.Errorf("%w: header says %d payload bytes, file has %d (truncated?)", ErrCorruptState, n, len(payload))
	}
	if sum := crc32.Checksum(payload, castagnoli); sum != binary.BigEndian.Uint32(data[20:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorruptState)
	}
	st := &statev1.State{}
	if err := proto.Unmarshal(payload, st); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptState, err)
	}
	return st, nil
}

// readStateFile returns the state and the file's length; nil when the file does not
// exist (first start).
func readStateFile(path string) (*statev1.State, int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read state file: %w", err)
	}
	st, err := decodeState(data)
	return st, int64(len(data)), err
}

// writeFileAtomic replaces path with data so that a crash at any point leaves either the
// old or the new content: write a temporary file, fsync it, rename it over path, fsync
// the directory so the rename itself is durable.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary state file: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write temporary state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync temporary state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close temporary state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename state file: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open state directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync state directory: %w", err)
	}
	return nil
}
