// Package layout has no code of its own: its tests hold the import rules that keep the
// shape of the repository described in docs/ARCHITECTURE.md, and fail when a package
// imports across a line it must not cross, or when the daemon parses an address outside
// the boundaries where addresses enter lbd.
package layout
