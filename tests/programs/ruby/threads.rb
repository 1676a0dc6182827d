# The Ruby field report in miniature: threads append strings of varied sizes
# to their own lists and drop most of them, then the process idles. Each
# thread's malloc calls land in its own glibc arena, which keeps the freed
# pages: RSS stays far above what Ruby knows it holds.
threads = 8.times.map do |t|
  Thread.new do
    random = Random.new(t)
    kept = []
    60_000.times do
      kept << ("x" * (random.rand(2000) + 24))
      kept.shift(kept.size / 2) if kept.size > 4000
    end
  end
end
threads.each(&:join)
GC.start
sleep(Float(ARGV[0] || "2"))
puts "done"
