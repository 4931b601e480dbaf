package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// How progress shows a job.
const (
	// redrawEvery bounds how often the line on a terminal is redrawn.
	redrawEvery = 200 * time.Millisecond
	// printEvery is the interval of the plain lines when the output is
	// not a terminal (a pipe, a file, a CI log).
	printEvery = 5 * time.Second
	// barWidth is the width of the bar on a terminal, in characters.
	barWidth = 30
)

// progress shows a job's progress on w (stderr): on a terminal one line
// redrawn in place, with a bar, step/total, the loss, samples/s and the time
// left; otherwise a plain line every printEvery and one at the end, so that
// `ppnode train ... 2>&1 | cat` shows the job between its plan and its
// result. With quiet (--json, whose output is for programs) it shows
// nothing. It owns no clock: every call says what time it is.
type progress struct {
	w            io.Writer
	total, batch int // steps in all, samples a step
	tty, quiet   bool
	// The reference of the time left: a step seen and when.
	fromStep int
	from     time.Time
	// The newest update; whether a terminal line is drawn and not ended;
	// when the last line was drawn or printed (at first: the start); the
	// step and time of the last plain line (-1: none yet).
	cur       progressUpdate
	drawn     bool
	last      time.Time
	lastStep  int
	lastPrint time.Time
	// The evaluation last shown: the step of its weights, when first
	// seen, the samples done and when as a plain line (zero: not yet);
	// inEval while it is what is shown (the steps wait for a later step).
	evalStep, evalDone  int
	evalFrom, evalPrint time.Time
	inEval              bool
}

// progressUpdate is what a job reported at a time.
type progressUpdate struct {
	step       int
	loss, rate float64 // rate: samples/s, as the job counts them
	at         time.Time
}

// newProgress returns the progress of a job of total steps of batch
// samples, starting at now.
func newProgress(w io.Writer, total, batch int, quiet bool, now time.Time) *progress {
	return &progress{w: w, total: max(total, 1), batch: batch, tty: isTerminal(w), quiet: quiet,
		from: now, last: now, lastStep: -1, evalStep: -1}
}

// update shows that the job has done step of its steps at now, with the
// last step's loss and rate samples/s.
func (p *progress) update(now time.Time, step int, loss, rate float64) {
	if p == nil || p.quiet {
		return
	}
	if step < p.fromStep {
		// Steps replayed after a recovery: the time left counts from here.
		p.fromStep, p.from = step, now
	}
	p.cur = progressUpdate{step: step, loss: loss, rate: rate, at: now}
	if p.inEval && step <= p.evalStep {
		return
	}
	p.inEval = false
	if p.tty {
		if step < p.total && p.drawn && now.Sub(p.last) < redrawEvery {
			return
		}
		p.last, p.drawn = now, true
		fmt.Fprintf(p.w, "\r%s %s\033[K", p.bar(step), p.describe(p.cur))
		return
	}
	if step == p.lastStep || step < p.total && now.Sub(p.last) < printEvery {
		return
	}
	p.print()
}

// print prints the newest update as a plain line.
func (p *progress) print() {
	u := p.cur
	line := "  step " + p.describe(u)
	if p.lastStep >= 0 && u.step > p.lastStep && u.at.After(p.lastPrint) {
		line += fmt.Sprintf(" (%.0f samples/s since the last line)", float64((u.step-p.lastStep)*p.batch)/u.at.Sub(p.lastPrint).Seconds())
	}
	fmt.Fprintln(p.w, line)
	p.last, p.lastStep, p.lastPrint = u.at, u.step, u.at
}

// describe is the part of a line both forms share: step/total, the loss,
// samples/s and the time left.
func (p *progress) describe(u progressUpdate) string {
	s := fmt.Sprintf("%d/%d  loss %.4f  %.0f samples/s", u.step, p.total, u.loss, u.rate)
	if eta, ok := p.eta(u); ok {
		s += "  ETA " + formatETA(eta)
	}
	return s
}

// eta estimates the time left after u at the pace since the reference.
func (p *progress) eta(u progressUpdate) (time.Duration, bool) {
	done, spent := u.step-p.fromStep, u.at.Sub(p.from)
	if done <= 0 || spent <= 0 || u.step >= p.total {
		return 0, false
	}
	return time.Duration(float64(spent) / float64(done) * float64(p.total-u.step)), true
}

// formatETA rounds d to what a reader needs: seconds under ten minutes,
// minutes beyond.
func formatETA(d time.Duration) string {
	if d < 10*time.Minute {
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// evaluating shows how far the evaluation of the weights after step has
// got at now: done of the test split's samples; on a terminal in the line
// (at most every redrawEvery), otherwise, once it has run printEvery, as a
// plain line every printEvery and when it is done. Until a later step,
// update only records the steps.
func (p *progress) evaluating(now time.Time, step, done, samples int) {
	if p == nil || p.quiet || samples <= 0 {
		return
	}
	shown := p.inEval && step == p.evalStep
	if !shown {
		p.inEval, p.evalStep, p.evalFrom, p.evalPrint = true, step, now, time.Time{}
	}
	line := fmt.Sprintf("evaluating the weights after step %d: %d/%d test samples", step, done, samples)
	if p.tty {
		if shown && p.drawn && done < samples && now.Sub(p.last) < redrawEvery {
			return
		}
		p.last, p.drawn = now, true
		fmt.Fprintf(p.w, "\r%s %s\033[K", barOf(done, samples), line)
		return
	}
	printed := !p.evalPrint.IsZero()
	switch {
	case !printed && now.Sub(p.evalFrom) < printEvery:
		return // a short evaluation prints nothing
	case printed && (done == p.evalDone || done < samples && now.Sub(p.evalPrint) < printEvery):
		return
	case !printed && p.cur.step > 0 && p.cur.step != p.lastStep:
		p.print() // the step whose weights these are, first
	}
	p.evalDone, p.evalPrint = done, now
	fmt.Fprintln(p.w, "  "+line)
}

func (p *progress) bar(step int) string { return barOf(step, p.total) }

// barOf is a bar barWidth wide, done of total full.
func barOf(step, total int) string {
	done := barWidth * min(step, total) / max(total, 1)
	var b strings.Builder
	b.WriteByte('[')
	for i := range barWidth {
		switch {
		case i < done:
			b.WriteByte('=')
		case i == done:
			b.WriteByte('>')
		default:
			b.WriteByte(' ')
		}
	}
	b.WriteByte(']')
	return b.String()
}

// done ends the progress: it ends the line on a terminal, and prints the
// newest update if it has not been.
func (p *progress) done() {
	switch {
	case p == nil || p.quiet:
	case p.tty && p.drawn:
		fmt.Fprintln(p.w)
		p.drawn = false
	case !p.tty && p.cur.step > 0 && p.cur.step != p.lastStep:
		p.print()
	}
}

// note prints a line of news (a re-plan, a recovery) above the bar.
func (p *progress) note(msg string) {
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
	fmt.Fprintln(p.w, msg)
}
