// Command configdoc writes the configuration reference's table into
// docs/configuration.md from the definitions -h prints (app.Reference):
//
//	go run ./scripts/configdoc        (or go generate ./app)
//
// app's TestConfigurationReferenceIsGenerated fails while the file and the
// definitions differ.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/sandboxowner/owner/app"
)

func main() {
	doc := flag.String("doc", "docs/configuration.md", "the file to update between its markers")
	flag.Parse()
	if err := run(*doc); err != nil {
		fmt.Fprintln(os.Stderr, "configdoc:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := app.SpliceReference(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if out == string(b) {
		return nil
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
