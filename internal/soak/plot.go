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

// plotLag draws the relay lag (unpublished outbox rows) and the consumer
// lag (records on the topic not yet applied) over time, with a tick per
// fault, as a PNG. Standard library only: axes, two lines, a 5x7 font.
func plotLag(w io.Writer, samples []sample, faults []Fault) error {
	const (
		width, height            = 1400, 600
		left, right, top, bottom = 90, 30, 80, 60
	)
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.White)
	pw, ph := width-left-right, height-top-bottom

	maxT := 1.0
	maxY := 10.0
	for _, s := range samples {
		maxT = math.Max(maxT, s.T)
		maxY = math.Max(maxY, float64(max(s.RelayLag, s.ConsumerLag)))
	}
	for _, f := range faults {
		maxT = math.Max(maxT, f.AtS)
	}
	yStep := niceStep(maxY / 5)
	maxY = math.Ceil(maxY/yStep) * yStep
	xStep := niceStep(maxT / 10)
	px := func(t float64) int { return left + int(t/maxT*float64(pw)) }
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
	text(img, left+pw/2-textWidth("SECONDS", 2)/2, top+ph+32, "SECONDS", axis, 2)

	// Faults: a tick above the plot area, a faint line through it for
	// broker and database restarts.
	for _, f := range faults {
		c := faultColor(f.Kind)
		x := px(f.AtS)
		vline(img, x, top-12, top-2, c)
		vline(img, x+1, top-12, top-2, c)
		if f.Kind == KindBrokerKill || f.Kind == KindPGRestart {
			faint := color.RGBA{c.R, c.G, c.B, 255}
			for y := top; y < top+ph; y += 4 {
				img.Set(x, y, faint)
			}
		}
	}

	relay := color.RGBA{30, 90, 200, 255}
	consumer := color.RGBA{210, 50, 40, 255}
	line := func(get func(sample) int64, c color.RGBA) {
		prevOK := false
		var x0, y0 int
		for _, s := range samples {
			v := get(s)
			if v < 0 {
				prevOK = false
				continue
			}
			x1, y1 := px(s.T), py(float64(v))
			if prevOK {
				drawLine(img, x0, y0, x1, y1, c)
				drawLine(img, x0, y0+1, x1, y1+1, c)
			}
			x0, y0, prevOK = x1, y1, true
		}
	}
	line(func(s sample) int64 { return s.ConsumerLag }, consumer)
	line(func(s sample) int64 { return s.RelayLag }, relay)

	// Title and legend: the lines on the first row, the fault ticks on
	// the second.
	text(img, left, 10, "LAG IN EVENTS", axis, 2)
	legend := func(x, y int, items []struct {
		name string
		c    color.RGBA
	}) {
		for _, l := range items {
			fill(img, image.Rect(x, y+4, x+14, y+14), l.c)
			text(img, x+20, y, l.name, axis, 2)
			x += 20 + textWidth(l.name, 2) + 28
		}
	}
	type item = struct {
		name string
		c    color.RGBA
	}
	legend(left+textWidth("LAG IN EVENTS", 2)+40, 10, []item{
		{"RELAY: UNPUBLISHED ROWS", relay}, {"CONSUMER: ON TOPIC, NOT APPLIED", consumer},
	})
	text(img, left, 36, "FAULTS", axis, 2)
	legend(left+textWidth("FAULTS", 2)+40, 36, []item{
		{"PROCESS", faultColor(KindRelayKill)}, {"BROKER", faultColor(KindBrokerKill)},
		{"POSTGRES", faultColor(KindPGRestart)}, {"PROXY", faultColor(KindProxyCutPG)},
	})
	return png.Encode(w, img)
}

func faultColor(kind string) color.RGBA {
	switch {
	case kind == KindBrokerKill:
		return color.RGBA{130, 60, 170, 255}
	case kind == KindPGRestart:
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
