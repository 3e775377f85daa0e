// Package archtest holds tests of the repository's layering: which packages
// may import which. It has no code.
package archtest
