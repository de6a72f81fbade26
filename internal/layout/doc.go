// Package layout has no code of its own: its test holds the import rules that keep the
// shape of the repository described in docs/ARCHITECTURE.md, and fails when a package
// imports across a line it must not cross.
package layout
