// Package layout holds no code: its test checks the import rules of the
// repository's layout (docs/ARCHITECTURE.md, "Package map"): production
// packages never import internal/dev, and the arrows between packages run
// one way.
package layout
