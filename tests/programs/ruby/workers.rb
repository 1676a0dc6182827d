# Worker threads each build a batch of records (hashes of strings of mixed
# sizes), keep one record in fifty, and drop the rest; then the process
# idles. Each thread's malloc calls land in its own glibc arena, which keeps
# the pages freed records leave behind.
workers = Integer(ARGV[1] || "6")
kept = Queue.new
threads = workers.times.map do |w|
  Thread.new do
    random = Random.new(w)
    batch = Array.new(20_000) do |i|
      { "id" => i, "name" => "n" * (random.rand(300) + 30), "body" => "b" * (random.rand(1500) + 100), "tags" => Array.new(3) { |t| "tag#{t}" } }
    end
    batch.each_with_index { |record, i| kept << record if i % 50 == 0 }
    batch = nil
  end
end
threads.each(&:join)
GC.start
puts "kept #{kept.size}"
$stdout.flush
sleep(Float(ARGV[0] || "2"))
