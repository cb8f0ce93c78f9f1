package records

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkWrite1000 encodes 1,000 records as Gym's lines and writes them
// with their manifest: in memory (the encoding's cost) and on the disk
// (with the three fsyncs).
func BenchmarkWrite1000(b *testing.B) {
	recs := make([]Record, 1000)
	for i := range recs {
		recs[i] = sampleRecords()[0]
		recs[i].SessionID = fmt.Sprintf("s%05d", i)
	}
	for _, tc := range []struct {
		name string
		fsys func() (FS, string)
	}{
		{"memfs", func() (FS, string) { return NewMemFS(), "/ck" }},
		{"disk", func() (FS, string) { return OS{}, b.TempDir() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			fsys, root := tc.fsys()
			for i := 0; i < b.N; i++ {
				lines := make([][]byte, len(recs))
				for j, r := range recs {
					var err error
					if lines[j], err = r.Line(); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := (Writer{FS: fsys, Participant: part}).Write(filepath.Join(root, fmt.Sprint(i)), "c", lines, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
