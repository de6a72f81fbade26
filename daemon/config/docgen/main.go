// Command docgen writes lbd's generated references: docs/reference/config.md from the
// configuration structs (keys and types by reflection, defaults from config.Default(),
// descriptions from the Go doc comments) and docs/reference/api.md from a buf image of
// the lbd.v1 proto files (comments from its source info). Both are generated so that
// they cannot drift from the code; `make docs` runs it and `make check-docs` fails when
// the committed output is stale.
//
// Usage, from the repository root:
//
//	buf build -o /tmp/lbd.binpb
//	go run ./daemon/config/docgen -image /tmp/lbd.binpb -out docs/reference
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("docgen", flag.ContinueOnError)
	root := fs.String("root", ".", "repository root (the Go sources are read from there)")
	image := fs.String("image", "", "buf image or FileDescriptorSet of proto/ with source info (buf build -o FILE)")
	out := fs.String("out", "docs/reference", "output directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *image == "" {
		return fmt.Errorf("-image is required: build one with 'buf build -o FILE'")
	}
	cfg, err := configReference(*root)
	if err != nil {
		return err
	}
	api, err := apiReference(*image)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	for name, data := range map[string][]byte{"config.md": cfg, "api.md": api} {
		if err := os.WriteFile(filepath.Join(*out, name), data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}
