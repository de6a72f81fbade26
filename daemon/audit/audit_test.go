package audit

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileRotates: records are JSON lines in a 0600 file, rotated at max_size_mb with
// the backups kept, and no record is lost across a rotation.
func TestFileRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	l := Open(Options{File: path, MaxSizeMB: 1, MaxBackups: 5})
	const n = 6000 // about 1.6 MB of records
	long := strings.Repeat("x", 200)
	for i := range n {
		l.Write(Record{Principal: "unix:uid:0", Transport: "unix", Method: "lbd.v1.LoadBalancerService/DeleteService",
			Services: []string{long}, Code: "OK", Revision: uint64(i + 1)})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "audit*.log"))
	if err != nil || len(files) < 2 {
		t.Fatalf("files after 1.6 MB into a 1 MB trail: %v, %v; want the file and a rotated one", files, err)
	}
	seen := map[uint64]bool{}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var r Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("%s: line %q: %v", f, sc.Text(), err)
			}
			seen[r.Revision] = true
		}
		fh.Close()
	}
	if len(seen) != n {
		t.Errorf("%d records across the files, want %d", len(seen), n)
	}
}
