package lbd_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// validStateFile runs lbd, creates a few services through the API, stops it, and returns
// the state file it wrote.
func validStateFile(t *testing.T) []byte {
	t.Helper()
	in := newInstance(t)
	p, conn := startLBD(t, in)
	lb := lbdv1.NewLoadBalancerServiceClient(conn)
	for i := range 5 {
		if _, err := lb.CreateService(ctxT(t), &lbdv1.CreateServiceRequest{Service: restartService(i)}); err != nil {
			t.Fatalf("create service: %v", err)
		}
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("lbd exited with code %d after SIGTERM", code)
	}
	data, err := os.ReadFile(in.statePath())
	if err != nil {
		t.Fatalf("read state file: %v", err)
	}
	return data
}

// stateFile frames a state the way lbd's file format does (magic, format version, payload
// length, CRC-32C of the payload), so that only the content can be wrong.
func stateFile(t *testing.T, st *statev1.State) []byte {
	t.Helper()
	payload, err := proto.Marshal(st)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	var buf bytes.Buffer
	buf.WriteString("LBDSTATE")
	buf.Write(binary.BigEndian.AppendUint32(nil, 1))
	buf.Write(binary.BigEndian.AppendUint64(nil, uint64(len(payload))))
	buf.Write(binary.BigEndian.AppendUint32(nil, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli))))
	buf.Write(payload)
	return buf.Bytes()
}

// TestCorruptStateStopsDaemon checks that lbd refuses to start on a state file it cannot
// trust, says which file and how to recover, and leaves the file byte for byte as it was:
// an operator must be able to inspect or restore it.
func TestCorruptStateStopsDaemon(t *testing.T) {
	valid := validStateFile(t)
	if len(valid) < 100 {
		t.Fatalf("state file of 5 services is only %d bytes", len(valid))
	}
	flipped := bytes.Clone(valid)
	flipped[len(flipped)/2] ^= 0x40
	garbage := make([]byte, 4096)
	rand.NewChaCha8([32]byte{1}).Read(garbage)
	// Two services with the same ID: a file lbd could not have written, though its
	// checksum is right.
	dup := &statev1.State{}
	for i := range 2 {
		svc := restartService(i)
		svc.Id, svc.Revision = 7, 1
		for j, b := range svc.Backends {
			b.Id = uint32(100*i + j + 1)
		}
		dup.Services = append(dup.Services, svc)
	}

	for _, tc := range []struct {
		name string
		data []byte
		// why is what the message must say about the file, besides that it is corrupt.
		why string
	}{
		{"truncated payload", valid[:len(valid)/2], "truncated"},
		{"truncated header", valid[:10], "truncated"},
		{"garbage", garbage, "not an lbd state file"},
		{"flipped bit", flipped, "checksum mismatch"},
		{"duplicate service ID", stateFile(t, dup), "duplicate id 7"},
		{"empty", nil, "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInstance(t)
			if err := os.MkdirAll(in.stateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(in.statePath(), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(tc.data)

			start := time.Now()
			code, out := runExit(t, 5*time.Second, in.args()...)
			if code == 0 {
				t.Fatalf("lbd exited 0 on a corrupt state file; output:\n%s", out)
			}
			t.Logf("exit code %d after %v", code, time.Since(start).Round(time.Millisecond))
			assertContains(t, out, in.statePath(), "corrupt", tc.why, "untouched", "state.pb.journal) from a backup", "move both aside")

			after, err := os.ReadFile(in.statePath())
			if err != nil {
				t.Fatalf("read state file after the failed start: %v", err)
			}
			if sha256.Sum256(after) != sum {
				t.Errorf("lbd changed the state file: %d bytes before, %d after", len(tc.data), len(after))
			}
			if _, err := os.Stat(in.socket); err == nil {
				t.Errorf("lbd created its socket %s though it refused to start", in.socket)
			}
			if leftovers, _ := filepath.Glob(in.statePath() + ".tmp-*"); len(leftovers) > 0 {
				t.Errorf("lbd left temporary files: %v", leftovers)
			}
		})
	}
}

// TestConfigErrorsExitTwo checks that a bad configuration, from a file or from flags, is
// refused with exit code 2 (usage error, as for a bad flag) and a message naming the field.
func TestConfigErrorsExitTwo(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string // configuration file content; none if empty
		args []string
		want []string
	}{
		{name: "unknown top-level field", file: "stat_dir: /tmp/x\n", want: []string{"unknown field", "stat_dir"}},
		{name: "unknown nested field", file: "log:\n  level: info\n  colour: true\n", want: []string{"unknown field", "colour"}},
		{name: "bad log level in file", file: "log:\n  level: verbose\n", want: []string{"log.level", "verbose"}},
		{name: "bad log level flag", args: []string{"--log-level", "loud"}, want: []string{"log.level", "loud"}},
		{name: "listen without certificates in file", file: "api:\n  tcp:\n    listen: 127.0.0.1:7443\n", want: []string{"api.tcp", "cert_file", "key_file", "client_ca_file"}},
		{name: "listen flag without certificates", args: []string{"--listen", "127.0.0.1:7443"}, want: []string{"api.tcp", "mutual TLS"}},
		{name: "listen with a certificate but no client CA", args: []string{"--listen", "127.0.0.1:7443", "--tls-cert", "/c.pem", "--tls-key", "/k.pem"}, want: []string{"api.tcp", "client_ca_file"}},
		{name: "relative state dir", args: []string{"--state-dir", "state"}, want: []string{"state_dir", "absolute"}},
		{name: "bad limit", file: "limits:\n  default_maglev_table_size: 1000\n", want: []string{"limits", "default_maglev_table_size"}},
		{name: "unknown flag", args: []string{"--colour"}, want: []string{"colour"}},
		{name: "stray argument", args: []string{"serve"}, want: []string{"unexpected arguments: serve"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInstance(t)
			args := in.args()
			if tc.file != "" {
				path := filepath.Join(filepath.Dir(in.socket), "lbd.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", path)
			}
			// Flags after the instance's own override them (state dir, log level).
			args = append(args, tc.args...)
			code, out := runExit(t, 5*time.Second, args...)
			if code != 2 {
				t.Errorf("exit code %d, want 2; output:\n%s", code, out)
			}
			assertContains(t, out, tc.want...)
			if _, err := os.Stat(in.stateDir); err == nil {
				t.Errorf("lbd created its state directory though its configuration is invalid")
			}
		})
	}
}

// TestCheckConfig checks --check-config on a valid configuration: exit 0, nothing created.
func TestCheckConfig(t *testing.T) {
	in := newInstance(t)
	code, out := runExit(t, 5*time.Second, in.args("--check-config")...)
	if code != 0 {
		t.Fatalf("exit code %d, want 0; output:\n%s", code, out)
	}
	assertContains(t, out, "configuration is valid")
	if _, err := os.Stat(in.stateDir); err == nil {
		t.Errorf("--check-config created the state directory")
	}
}
