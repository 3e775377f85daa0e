package soak

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
)

// plotRun draws the run as a PNG: on top the throughput (events committed
// and applied per second, each a moving average over throughputWindow), below
// it the relay lag (unpublished outbox rows) and the consumer lag (records
// on the topics not yet applied), both over time, with every fault marked:
// a tick above each panel and a dotted line through it. Standard library
// only: axes, lines, a 5x7 font.
func plotRun(w io.Writer, samples []sample, faults []Fault) error {
	const (
		width, height = 1400, 980
		left, right   = 90, 30
		// Two panels, each with a title row and a legend row above it.
		top1, h1 = 120, 330
		top2, h2 = top1 + h1 + 130, 330
	)
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.White)
	pw := width - left - right
	maxT := 1.0
	for _, s := range samples {
		maxT = math.Max(maxT, s.T)
	}
	for _, f := range faults {
		maxT = math.Max(maxT, f.AtS)
	}
	px := func(t float64) int { return left + int(t/maxT*float64(pw)) }
	axis := color.RGBA{60, 60, 60, 255}

	committedRate, appliedRate := rates(samples, func(s sample) int64 { return s.Committed }), rates(samples, func(s sample) int64 { return s.Applied })
	green := color.RGBA{30, 150, 70, 255}
	purple := color.RGBA{130, 60, 170, 255}
	relay := color.RGBA{30, 90, 200, 255}
	consumer := color.RGBA{210, 50, 40, 255}
	panel(img, px, maxT, top1, h1, faults, "THROUGHPUT IN EVENTS PER SECOND", []series1{
		{"COMMITTED", green, committedRate}, {"APPLIED (CONSUMER SOAK)", purple, appliedRate},
	})
	panel(img, px, maxT, top2, h2, faults, "LAG IN EVENTS", []series1{
		{"RELAY: UNPUBLISHED ROWS", relay, column(samples, func(s sample) int64 { return s.RelayLag })},
		{"CONSUMER: ON TOPIC, NOT APPLIED", consumer, column(samples, func(s sample) int64 { return s.ConsumerLag })},
	})
	text(img, left+pw/2-textWidth("SECONDS", 2)/2, top2+h2+32, "SECONDS", axis, 2)
	text(img, left, 14, "FAULTS", axis, 2)
	legend(img, left+textWidth("FAULTS", 2)+40, 14, []legendItem{
		{"PROCESS", faultColor(KindRelayKill)}, {"BROKER KILLED, CUT OFF OR DISK FULL", faultColor(KindBrokerKill)},
		{"POSTGRES", faultColor(KindPGRestart)}, {"PROXY", faultColor(KindProxyCutPG)},
	})
	return png.Encode(w, img)
}

// point is one value of a line at time t; a negative value is a hole.
type point struct {
	t, v float64
}

type series1 struct {
	name   string
	c      color.RGBA
	points []point
}

type legendItem struct {
	name string
	c    color.RGBA
}

func legend(img *image.RGBA, x, y int, items []legendItem) {
	axis := color.RGBA{60, 60, 60, 255}
	for _, l := range items {
		fill(img, image.Rect(x, y+4, x+14, y+14), l.c)
		text(img, x+20, y, l.name, axis, 2)
		x += 20 + textWidth(l.name, 2) + 28
	}
}

func column(samples []sample, get func(sample) int64) []point {
	out := make([]point, len(samples))
	for i, s := range samples {
		out[i] = point{s.T, float64(get(s))}
	}
	return out
}

// throughputWindow smooths the per-second rates.
const throughputWindow = 5.0

// rates turns a counter into events per second over the last
// throughputWindow seconds (a hole where the counter could not be read).
func rates(samples []sample, get func(sample) int64) []point {
	var out []point
	j := 0 // the oldest sample inside the window, with a value
	for i, s := range samples {
		v := get(s)
		if v < 0 {
			out = append(out, point{s.T, -1})
			continue
		}
		for j < i && (get(samples[j]) < 0 || s.T-samples[j].T > throughputWindow) {
			j++
		}
		if j == i || s.T <= samples[j].T {
			out = append(out, point{s.T, -1})
			continue
		}
		out = append(out, point{s.T, math.Max(0, float64(v-get(samples[j]))/(s.T-samples[j].T))})
	}
	return out
}

// panel draws one chart: grid, axes, fault marks and lines, its title and
// legend on the two rows above it.
func panel(img *image.RGBA, px func(float64) int, maxT float64, top, ph int, faults []Fault, title string, lines []series1) {
	const left = 90
	pw := img.Bounds().Dx() - left - 30
	maxY := 10.0
	for _, l := range lines {
		for _, p := range l.points {
			maxY = math.Max(maxY, p.v)
		}
	}
	yStep := niceStep(maxY / 5)
	maxY = math.Ceil(maxY/yStep) * yStep
	xStep := niceStep(maxT / 10)
	py := func(v float64) int { return top + ph - int(v/maxY*float64(ph)) }
	grid := color.RGBA{225, 225, 225, 255}
	axis := color.RGBA{60, 60, 60, 255}
	for v := 0.0; v <= maxY+yStep/2; v += yStep {
		hline(img, left, left+pw, py(v), grid)
		label := fmt.Sprint(int64(v))
		text(img, left-8-textWidth(label, 2), py(v)-7, label, axis, 2)
	}
	for t := 0.0; t <= maxT+xStep/2; t += xStep {
		vline(img, px(t), top, top+ph, grid)
		label := fmt.Sprint(int64(t))
		text(img, px(t)-textWidth(label, 2)/2, top+ph+8, label, axis, 2)
	}
	hline(img, left, left+pw, top+ph, axis)
	vline(img, left, top, top+ph, axis)
	for _, f := range faults {
		c := faultColor(f.Kind)
		x := px(f.AtS)
		vline(img, x, top-12, top-2, c)
		vline(img, x+1, top-12, top-2, c)
		for y := top; y < top+ph; y += 4 {
			img.Set(x, y, c)
		}
	}
	for _, l := range lines {
		prevOK := false
		var x0, y0 int
		for _, p := range l.points {
			if p.v < 0 {
				prevOK = false
				continue
			}
			x1, y1 := px(p.t), py(p.v)
			if prevOK {
				drawLine(img, x0, y0, x1, y1, l.c)
				drawLine(img, x0, y0+1, x1, y1+1, l.c)
			}
			x0, y0, prevOK = x1, y1, true
		}
	}
	text(img, left, top-62, title, axis, 2)
	items := make([]legendItem, len(lines))
	for i, l := range lines {
		items[i] = legendItem{l.name, l.c}
	}
	legend(img, left, top-38, items)
}

func faultColor(kind string) color.RGBA {
	switch {
	case kind == KindBrokerKill || kind == KindBrokerPartition || kind == KindBrokerDiskFull || kind == KindBrokerCtrlPartition:
		return color.RGBA{130, 60, 170, 255}
	case kind == KindPGRestart || kind == KindPGSwitchover:
		return color.RGBA{30, 150, 70, 255}
	case strings.HasPrefix(kind, "proxy"):
		return color.RGBA{140, 140, 140, 255}
	default:
		return color.RGBA{240, 150, 20, 255}
	}
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return math.Max(1, m*p)
		}
	}
	return 10 * p
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.Set(x, y, c)
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

// drawLine is Bresenham's.
func drawLine(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func textWidth(s string, scale int) int { return len(s) * 6 * scale }

// text draws s (upper case, digits and a little punctuation) at x, y.
func text(img *image.RGBA, x, y int, s string, c color.Color, scale int) {
	for _, r := range strings.ToUpper(s) {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		for row, bits := range g {
			for col, b := range bits {
				if b != '#' {
					continue
				}
				fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
			}
		}
		x += 6 * scale
	}
}

// glyphs is a 5x7 font.
var glyphs = map[rune][7]string{
	' ': {".....", ".....", ".....", ".....", ".....", ".....", "....."},
	'0': {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."},
	'1': {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'2': {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"},
	'3': {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."},
	'4': {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."},
	'5': {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."},
	'6': {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."},
	'7': {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."},
	'8': {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."},
	'9': {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."},
	'A': {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"},
	'B': {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."},
	'C': {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."},
	'D': {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."},
	'E': {"#####", "#....", "#....", "####.", "#....", "#....", "#####"},
	'F': {"#####", "#....", "#....", "####.", "#....", "#....", "#...."},
	'G': {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"},
	'H': {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"},
	'I': {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'J': {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."},
	'K': {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"},
	'L': {"#....", "#....", "#....", "#....", "#....", "#....", "#####"},
	'M': {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"},
	'N': {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"},
	'O': {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."},
	'P': {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."},
	'Q': {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"},
	'R': {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"},
	'S': {".####", "#....", "#....", ".###.", "....#", "....#", "####."},
	'T': {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."},
	'U': {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."},
	'V': {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."},
	'W': {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."},
	'X': {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"},
	'Y': {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."},
	'Z': {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"},
	'.': {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."},
	',': {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."},
	':': {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."},
	'-': {".....", ".....", ".....", "#####", ".....", ".....", "....."},
	'/': {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."},
	'(': {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."},
	')': {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."},
	'%': {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"},
	'?': {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."},
}
