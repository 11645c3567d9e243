package app

import (
	"errors"

	"github.com/traceops/trace/analyzer"
)

func newLLMLabeler(a *App) (analyzer.Labeler, error) {
	return nil, errors.New("analyzer.labeler llm: not wired yet")
}
